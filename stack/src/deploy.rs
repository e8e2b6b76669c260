//! The ClickHouse files of the compose stack under `deploy/clickhouse/` that are rendered from
//! the stack's templates (`stack render-deploy` writes them; a unit test fails while the
//! committed file differs): `users.xml`, from [`crate::users`].

use std::path::Path;

use crate::users::{self, Password, Profile, Root, User, UsersXml};
use crate::Result;

/// The compose stack's network (`x-subnet` in `compose.yaml`; `scripts/check-containers.py`
/// checks that they agree): where the collectors and Grafana log in to ClickHouse from.
pub const SUBNET: &str = "172.30.80.0/24";

/// The environment variable a replica reads the `collector` user's password from (`.env`).
pub const COLLECTOR_PASSWORD_ENV: &str = "CLICKHOUSE_COLLECTOR_PASSWORD";

/// The environment variable a replica reads the `dashboard` user's password from (`.env`).
pub const DASHBOARD_PASSWORD_ENV: &str = "CLICKHOUSE_DASHBOARD_PASSWORD";

/// The path of the rendered `users.xml` in the repository.
pub const USERS_XML: &str = "deploy/clickhouse/users.xml";

const USERS_COMMENT: &str = "Who gets into ClickHouse: the whole users.xml of every replica
     (compose.yaml mounts it over /etc/clickhouse-server/users.xml and sets
     CLICKHOUSE_SKIP_USER_SETUP=1, so that the image's entrypoint leaves users alone and this
     file alone decides). Rendered by `scripts/stack.sh render-deploy` from the template in
     stack/src/users.rs and stack/src/deploy.rs, where each right is explained: do not edit it
     here (a unit test fails while the two differ).

     default    every right, no password, from each server's own loopback only: the compose
                healthcheck (wget inside the container) and an operator's
                `docker compose exec clickhouse-r1 clickhouse-client`. No other container and
                no process on the host reaches it (compose.yaml publishes no ClickHouse port).
     collector  the collectors and their one-shot commands (migrate, seed, retention, sites
                purge), from the stack's network only, password CLICKHOUSE_COLLECTOR_PASSWORD
                (.env; compose.yaml hands it to the collectors as a file); rights on the
                database `collector` only, those its statements need (docs/deployment.md,
                \"ClickHouse users\").
     dashboard  Grafana's ClickHouse data source: SELECT on `collector` only, readonly=1 (no
                setting changed but max_execution_time, which the data source's driver sends),
                from the stack's network only, password CLICKHOUSE_DASHBOARD_PASSWORD (.env).

     The passwords are read from the server's environment (from_env; compose.yaml passes them
     from .env and refuses to start without them). Beware: a server started with this file but
     without a variable gives that user an EMPTY password (measured on 26.9), so set both
     wherever the file is used. The subnet must be the one in compose.yaml (x-subnet);
     scripts/check-containers.sh checks that they agree, and all the above.";

/// The users of the compose stack's replicas with the given passwords and networks of
/// `collector` and `dashboard`: `default` (no password, loopback, every right), then
/// [`users::collector`] and [`users::dashboard`]. The tests run these on a ClickHouse 26.x
/// server with loopback networks and SHA-256 passwords.
pub fn users<'a>(
    collector: Password<'a>,
    dashboard: Password<'a>,
    networks: &'a [&'a str],
) -> [User<'a>; 3] {
    [
        User::DEFAULT,
        users::collector(collector, networks),
        users::dashboard(dashboard, networks),
    ]
}

/// The profiles of the compose stack's replicas: `default` without settings (the server's
/// defaults) and [`users::DASHBOARD_PROFILE`].
pub const PROFILES: [Profile<'static>; 2] = [
    Profile {
        name: "default",
        settings: &[],
        changeable_in_readonly: &[],
    },
    users::DASHBOARD_PROFILE,
];

/// The text of `deploy/clickhouse/users.xml`: [`PROFILES`] and [`users`] with the passwords
/// from [`COLLECTOR_PASSWORD_ENV`] and [`DASHBOARD_PASSWORD_ENV`] and the network [`SUBNET`].
pub fn users_xml() -> String {
    let networks = [SUBNET];
    let users = users(
        Password::FromEnv(COLLECTOR_PASSWORD_ENV),
        Password::FromEnv(DASHBOARD_PASSWORD_ENV),
        &networks,
    );
    UsersXml {
        root: Root::ClickHouse,
        comment: USERS_COMMENT,
        profiles: &PROFILES,
        users: &users,
    }
    .render()
}

/// Writes every rendered file under `repo` (the repository's root) whose text differs; returns
/// the paths written (relative to `repo`).
///
/// Errors: a file that could not be read or written.
pub fn render(repo: &Path) -> Result<Vec<&'static str>> {
    let mut written = Vec::new();
    if write_on_change(&repo.join(USERS_XML), &users_xml())? {
        written.push(USERS_XML);
    }
    Ok(written)
}

/// Writes `text` to `path` unless the file holds it already; whether it wrote.
fn write_on_change(path: &Path, text: &str) -> Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::write(path, text)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_users_xml_is_the_rendered_template() {
        let committed = include_str!("../../deploy/clickhouse/users.xml");
        assert!(
            committed == users_xml(),
            "{USERS_XML} is not what the template renders: run \
             `scripts/stack.sh render-deploy` and commit the result"
        );
    }
}
