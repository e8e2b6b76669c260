//! ClickHouse's `users.xml`: the one template for every ClickHouse server the project runs or
//! ships: the stack's 18.16 replicas and 26.x server, the tests' own servers (TLS, passwords,
//! the shipped grants) and `deploy/clickhouse/users.xml` of the compose stack
//! ([`crate::deploy`]). A file is a [`UsersXml`]: profiles, users and the one quota
//! `default` without limits.
//!
//! The users of `deploy/` are defined here once ([`migrate`], [`collector`], [`dashboard`],
//! with [`MIGRATE_GRANTS`], [`COLLECTOR_GRANTS`], [`DASHBOARD_GRANTS`] and
//! [`DASHBOARD_PROFILE`]), so that the test that runs them on a real ClickHouse 26.x server
//! checks the very rights that ship.

/// The default profile's settings of every server the stack runs, before the caller's:
/// memory per query 1 GiB (three servers, ZooKeeper and PostgreSQL share 2 cores and a few
/// GiB), no uncompressed cache, replicas of a `Distributed` read chosen at random.
pub const PROFILE_BASE: [(&str, &str); 3] = [
    ("max_memory_usage", "1073741824"),
    ("use_uncompressed_cache", "0"),
    ("load_balancing", "random"),
];

/// Loopback, IPv6 and IPv4: where the stack's users log in from.
pub const LOOPBACK: [&str; 2] = ["::1", "127.0.0.1"];

/// The rights of the serving collectors' write user `collector` (`collector serve`) on the
/// database `collector`, and why (docs/deployment.md, "ClickHouse users"): what the
/// statements of `serve` need, no more (an address that breaks into a collector cannot
/// destroy data with them):
///
/// - `SELECT, INSERT`: the writer's inserts, the prober;
/// - `CREATE DATABASE, CREATE TABLE`: the prober applying the schema (`CREATE ... IF NOT
///   EXISTS`) to a replica that returns without the table, and `measurements_all` there;
/// - `TABLE ENGINE` on the table's two engines and `Distributed`: ClickHouse 26.x asks for it
///   (`table_engines_require_grant`);
/// - `SELECT` on the system tables `serve` reads which 26.x shows only with a grant
///   (measured on 26.9.2.1): `replicas` (the prober), `macros` and `merge_tree_settings`
///   (applying the schema), `clusters` (`measurements_all`), `parts` (the retention's look
///   for expired months).
///
/// No `ALTER`, no `DROP`, no `DELETE`, no `TRUNCATE`: `serve`'s retention finds nothing to
/// change once [`MIGRATE_GRANTS`]' user has set the table's TTL (`collector retention`, which
/// compose's `migrate` runs), and what it cannot change it reports and tries again the next
/// day. No user management, no `SYSTEM`, no other database.
pub const COLLECTOR_GRANTS: [&str; 9] = [
    "GRANT SELECT, INSERT, CREATE DATABASE, CREATE TABLE ON collector.*",
    "GRANT TABLE ENGINE ON ReplicatedReplacingMergeTree",
    "GRANT TABLE ENGINE ON ReplacingMergeTree",
    "GRANT TABLE ENGINE ON Distributed",
    "GRANT SELECT ON system.replicas",
    "GRANT SELECT ON system.macros",
    "GRANT SELECT ON system.merge_tree_settings",
    "GRANT SELECT ON system.clusters",
    "GRANT SELECT ON system.parts",
];

/// The rights of the migrate user `migrate` (the one-shot commands `migrate`, `seed`,
/// `retention`, `sites purge`) on the database `collector`, and why (docs/deployment.md,
/// "ClickHouse users"):
///
/// - `SELECT, INSERT`: `migrate` (copying an older table's rows, writing rows minimised anew
///   and the marks of the partitions done, `collector/src/clickhouse/minimise.rs`);
/// - `CREATE DATABASE, CREATE TABLE`: `migrate` (the tables, the marks table `minimised`);
/// - `TABLE ENGINE` on the table's two engines and `Distributed` (`measurements_all`):
///   ClickHouse 26.x asks for it (`table_engines_require_grant`);
/// - `ALTER ADD COLUMN`: `migrate` on a table of an older release;
/// - `ALTER DELETE`: `sites purge` (`ALTER TABLE ... DELETE`) and `retention` where a table
///   has no TTL (`DROP PARTITION`);
/// - `OPTIMIZE`: `migrate` merging a partition it rewrote, so that the unminimised versions
///   leave the disk now (refused, they would go at ClickHouse's own merges);
/// - `ALTER MODIFY TTL`: `retention` (the table's TTL follows `COLLECTOR_RETENTION`);
/// - `DROP TABLE`: `migrate` moving a v1 table aside (`RENAME` needs it on the old name) and
///   making `measurements_all` anew;
/// - `SELECT` on six system tables, which 26.x shows only with a grant (measured on
///   26.9.2.1): `replicas`, `mutations` (`sites purge` waits for its deletions), `parts`
///   (retention by partition, purge), `macros` and `merge_tree_settings` (`migrate`), and
///   `clusters` (`migrate` checks the cluster `measurements_all` reads over, contract v5 §3).
///
/// No user management, no `SYSTEM`, no other database.
pub const MIGRATE_GRANTS: [&str; 10] = [
    "GRANT SELECT, INSERT, CREATE DATABASE, CREATE TABLE, ALTER ADD COLUMN, ALTER DELETE, \
     ALTER MODIFY TTL, DROP TABLE, OPTIMIZE ON collector.*",
    "GRANT TABLE ENGINE ON ReplicatedReplacingMergeTree",
    "GRANT TABLE ENGINE ON ReplacingMergeTree",
    "GRANT TABLE ENGINE ON Distributed",
    "GRANT SELECT ON system.replicas",
    "GRANT SELECT ON system.mutations",
    "GRANT SELECT ON system.parts",
    "GRANT SELECT ON system.macros",
    "GRANT SELECT ON system.merge_tree_settings",
    "GRANT SELECT ON system.clusters",
];

/// The rights of the dashboards' user (Grafana's ClickHouse data source): reading the
/// database `collector`, nothing else.
pub const DASHBOARD_GRANTS: [&str; 1] = ["GRANT SELECT ON collector.*"];

/// The dashboards' profile: read-only (`readonly=1`), 60 s per query by default and at most
/// 1,000,000 result rows (the rest cut off, not an error); only `max_execution_time` may be
/// changed, up to 600 s, which Grafana's ClickHouse driver sends with every query.
pub const DASHBOARD_PROFILE: Profile<'static> = Profile {
    name: "dashboard",
    settings: &[
        ("readonly", "1"),
        ("max_execution_time", "60"),
        ("max_result_rows", "1000000"),
        ("result_overflow_mode", "break"),
    ],
    changeable_in_readonly: &[("max_execution_time", "600")],
};

/// The root element of a ClickHouse config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// `<yandex>`: the only root ClickHouse 18.16 reads.
    Yandex,
    /// `<clickhouse>`: current releases' (they read `<yandex>` too, with a warning).
    ClickHouse,
}

impl Root {
    fn tag(self) -> &'static str {
        match self {
            Root::Yandex => "yandex",
            Root::ClickHouse => "clickhouse",
        }
    }
}

/// How a user proves who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Password<'a> {
    /// No password (`<password></password>`).
    None,
    /// The SHA-256 of the password in lower-case hex (64 digits), so that the password is in
    /// no file.
    Sha256Hex(&'a str),
    /// Read by the server from its environment variable of this name (`from_env`). Beware: a
    /// server started without the variable gives the user an EMPTY password (measured on
    /// 26.9), so whoever starts it must set the variable.
    FromEnv(&'a str),
}

/// A settings profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile<'a> {
    /// Its name: `[A-Za-z0-9_]` (an XML tag).
    pub name: &'a str,
    /// Its settings in order, `(NAME, VALUE)`; NAME an XML tag, VALUE escaped as text.
    pub settings: &'a [(&'a str, &'a str)],
    /// Settings that a read-only user of the profile may still change, each up to its
    /// maximum: `(NAME, MAX)` (a `<constraints>` entry with `<changeable_in_readonly/>`, which
    /// ClickHouse knows since 22.x; 18.16 gets none).
    pub changeable_in_readonly: &'a [(&'a str, &'a str)],
}

/// A user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User<'a> {
    /// Its name: `[A-Za-z0-9_]` (an XML tag).
    pub name: &'a str,
    /// How it logs in.
    pub password: Password<'a>,
    /// Where from: addresses or subnets (`<ip>`), e.g. [`LOOPBACK`].
    pub networks: &'a [&'a str],
    /// The name of its profile.
    pub profile: &'a str,
    /// Its `GRANT` statements; empty: every right (a `users.xml` user without `<grants>` has
    /// them all; ClickHouse 18.16 knows no grants, so its users get none).
    pub grants: &'a [&'a str],
}

impl User<'_> {
    /// `default` without a password from loopback, every right: what the stack's servers run
    /// with.
    pub const DEFAULT: User<'static> = User {
        name: "default",
        password: Password::None,
        networks: &LOOPBACK,
        profile: "default",
        grants: &[],
    };
}

/// The serving collectors' write user: `collector` with `password` from `networks`, the
/// default profile and [`COLLECTOR_GRANTS`].
pub fn collector<'a>(password: Password<'a>, networks: &'a [&'a str]) -> User<'a> {
    User {
        name: "collector",
        password,
        networks,
        profile: "default",
        grants: &COLLECTOR_GRANTS,
    }
}

/// The one-shot commands' migrate user: `migrate` with `password` from `networks`, the
/// default profile and [`MIGRATE_GRANTS`].
pub fn migrate<'a>(password: Password<'a>, networks: &'a [&'a str]) -> User<'a> {
    User {
        name: "migrate",
        password,
        networks,
        profile: "default",
        grants: &MIGRATE_GRANTS,
    }
}

/// The dashboards' user: `dashboard` with `password` from `networks`, the profile
/// [`DASHBOARD_PROFILE`] and [`DASHBOARD_GRANTS`].
pub fn dashboard<'a>(password: Password<'a>, networks: &'a [&'a str]) -> User<'a> {
    User {
        name: "dashboard",
        password,
        networks,
        profile: DASHBOARD_PROFILE.name,
        grants: &DASHBOARD_GRANTS,
    }
}

/// `grants` with the database `collector` (`ON collector.*`) replaced by `database`, for a
/// collector whose `COLLECTOR_CLICKHOUSE_DATABASE` is not `collector` (docs/deployment.md).
pub fn grants_on(grants: &[&str], database: &str) -> Vec<String> {
    grants
        .iter()
        .map(|g| g.replace(" ON collector.*", &format!(" ON {database}.*")))
        .collect()
}

/// A whole `users.xml`.
#[derive(Debug, Clone, Copy)]
pub struct UsersXml<'a> {
    /// Its root element.
    pub root: Root,
    /// A comment after the "generated" line (without `--`), or empty.
    pub comment: &'a str,
    /// Its profiles; the users' profiles must be among them.
    pub profiles: &'a [Profile<'a>],
    /// Its users.
    pub users: &'a [User<'a>],
}

impl UsersXml<'_> {
    /// The file's text: the XML declaration, a comment naming this template, the comment,
    /// the profiles, the users and the quota `default` without limits.
    pub fn render(&self) -> String {
        let root = self.root.tag();
        let comment = match self.comment {
            "" => String::new(),
            text => {
                let mut text = text.to_owned();
                while text.contains("--") {
                    text = text.replace("--", "- -");
                }
                format!("<!-- {text} -->\n")
            }
        };
        let profiles: String = self.profiles.iter().map(profile_xml).collect();
        let users: String = self.users.iter().map(user_xml).collect();
        format!(
            r#"<?xml version="1.0"?>
<!-- generated by the collector-stack crate (stack/src/users.rs) -->
{comment}<{root}>
    <profiles>
{profiles}    </profiles>
    <users>
{users}    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</{root}>
"#
        )
    }
}

/// The settings of the stack's default profile: first those of [`PROFILE_BASE`] that
/// `profile` does not name, then every setting of `profile` in its order.
pub fn stack_profile(profile: &[(String, String)]) -> Vec<(&str, &str)> {
    let kept = PROFILE_BASE
        .iter()
        .filter(|(k, _)| !profile.iter().any(|(p, _)| p == k))
        .map(|(k, v)| (*k, *v));
    let given = profile.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    kept.chain(given).collect()
}

/// The text of a `users.xml` of the stack with root `root`: the default profile of
/// [`stack_profile`] of `profile` (`NAME`, `VALUE` pairs, already checked by the caller),
/// `extra` profiles after it, and `users`.
pub fn users_xml(
    root: Root,
    profile: &[(String, String)],
    extra: &[Profile],
    users: &[User],
) -> String {
    let settings = stack_profile(profile);
    let mut profiles = vec![Profile {
        name: "default",
        settings: &settings,
        changeable_in_readonly: &[],
    }];
    profiles.extend_from_slice(extra);
    UsersXml {
        root,
        comment: "",
        profiles: &profiles,
        users,
    }
    .render()
}

/// `text` with `&`, `<` and `>` escaped, for an element's content.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn profile_xml(profile: &Profile) -> String {
    let name = profile.name;
    let mut out = format!("        <{name}>\n");
    for (k, v) in profile.settings {
        out.push_str(&format!("            <{k}>{}</{k}>\n", escape(v)));
    }
    if !profile.changeable_in_readonly.is_empty() {
        out.push_str("            <constraints>\n");
        for (k, max) in profile.changeable_in_readonly {
            out.push_str(&format!(
                "                <{k}>\n                    <max>{}</max>\n                    \
                 <changeable_in_readonly/>\n                </{k}>\n",
                escape(max)
            ));
        }
        out.push_str("            </constraints>\n");
    }
    out.push_str(&format!("        </{name}>\n"));
    out
}

fn user_xml(user: &User) -> String {
    let name = user.name;
    let password = match user.password {
        Password::None => "<password></password>".to_owned(),
        Password::Sha256Hex(hex) => {
            format!("<password_sha256_hex>{}</password_sha256_hex>", escape(hex))
        }
        Password::FromEnv(var) => format!("<password from_env=\"{}\"/>", escape(var)),
    };
    let ips: String = user
        .networks
        .iter()
        .map(|ip| format!("                <ip>{}</ip>\n", escape(ip)))
        .collect();
    let grants = match user.grants {
        [] => String::new(),
        grants => {
            let queries: String = grants
                .iter()
                .map(|g| format!("                <query>{}</query>\n", escape(g)))
                .collect();
            format!("            <grants>\n{queries}            </grants>\n")
        }
    };
    format!(
        "        <{name}>\n            {password}\n            <networks>\n{ips}            \
         </networks>\n            <profile>{profile}</profile>\n            <quota>default</quota>\n\
         {grants}        </{name}>\n",
        profile = escape(user.profile),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_settings_override_the_base_in_place_of_it() {
        let given = [("max_memory_usage".to_owned(), "5".to_owned())];
        assert_eq!(
            stack_profile(&given),
            [
                ("use_uncompressed_cache", "0"),
                ("load_balancing", "random"),
                ("max_memory_usage", "5")
            ]
        );
    }

    #[test]
    fn users_get_their_password_networks_profile_and_grants() {
        let hex = "ab".repeat(32);
        let xml = users_xml(
            Root::ClickHouse,
            &[],
            &[DASHBOARD_PROFILE],
            &[
                User::DEFAULT,
                migrate(Password::Sha256Hex(&hex), &LOOPBACK),
                collector(Password::Sha256Hex(&hex), &LOOPBACK),
                dashboard(Password::FromEnv("PW"), &["10.0.0.0/8"]),
            ],
        );
        assert!(xml.contains("<clickhouse>\n") && xml.ends_with("</clickhouse>\n"));
        assert!(xml.contains("<default>\n            <password></password>"));
        assert!(xml.contains(&format!(
            "<collector>\n            <password_sha256_hex>{hex}</password_sha256_hex>"
        )));
        assert!(xml.contains("<dashboard>\n            <password from_env=\"PW\"/>"));
        assert_eq!(xml.matches("<ip>127.0.0.1</ip>").count(), 3);
        assert!(xml.contains("<ip>10.0.0.0/8</ip>\n            </networks>\n            <profile>dashboard</profile>"));
        assert_eq!(xml.matches("<query>GRANT").count(), 20);
        assert!(xml.contains("<migrate>\n            <password_sha256_hex>"));
        assert!(xml.contains(
            "<max_execution_time>\n                    <max>600</max>\n                    \
             <changeable_in_readonly/>"
        ));
        assert!(!xml.contains("<default>\n            <password></password>\n            <networks>\n                <ip>::1</ip>\n                <ip>127.0.0.1</ip>\n            </networks>\n            <profile>default</profile>\n            <quota>default</quota>\n            <grants>"));
    }

    #[test]
    fn the_write_user_may_not_alter_drop_or_delete() {
        for grant in COLLECTOR_GRANTS {
            let rights = grant.split(" ON ").next().unwrap();
            for right in [
                "ALTER", "DROP", "DELETE", "TRUNCATE", "ALL", "SYSTEM", "USER",
            ] {
                assert!(!rights.contains(right), "{grant} grants {right}");
            }
        }
    }

    #[test]
    fn grants_move_to_another_database() {
        let on = grants_on(&MIGRATE_GRANTS, "t_1");
        assert!(on[0].ends_with("OPTIMIZE ON t_1.*"), "{}", on[0]);
        assert_eq!(on[4], "GRANT SELECT ON system.replicas");
        let on = grants_on(&COLLECTOR_GRANTS, "t_1");
        assert_eq!(
            on[0],
            "GRANT SELECT, INSERT, CREATE DATABASE, CREATE TABLE ON t_1.*"
        );
        assert_eq!(
            grants_on(&DASHBOARD_GRANTS, "t_1"),
            ["GRANT SELECT ON t_1.*"]
        );
    }

    #[test]
    fn text_is_escaped_and_comments_cannot_end_early() {
        let p = Profile {
            name: "p",
            settings: &[("s", "a<b&c")],
            changeable_in_readonly: &[],
        };
        let xml = UsersXml {
            root: Root::Yandex,
            comment: "a --- b",
            profiles: &[p],
            users: &[],
        }
        .render();
        assert!(xml.contains("<s>a&lt;b&amp;c</s>"), "{xml}");
        assert!(xml.contains("<!-- a - - - b -->"), "{xml}");
    }
}
