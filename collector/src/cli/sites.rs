//! `collector sites add|list|enable|disable`: the `sites` table, through the settings store.

use super::SitesCommand;
use super::{cli_store, failed, RunError};
use crate::beacon;
use crate::config::Config;
use crate::settings;

/// Runs one `sites` subcommand.
pub async fn run(config: &Config, command: SitesCommand) -> Result<(), RunError> {
    let store = cli_store(config)?;
    match command {
        SitesCommand::Add {
            key,
            origins,
            sample_rate,
            disabled,
        } => {
            if !beacon::is_site_key(&key) {
                return Err(RunError::Usage(format!(
                    "--key {key:?}: must be 1 to 64 characters from A-Za-z0-9._-"
                )));
            }
            if !(0.0..=1.0).contains(&sample_rate) {
                return Err(RunError::Usage(format!(
                    "--sample-rate {sample_rate}: must be between 0 and 1"
                )));
            }
            let mut allowed = Vec::new();
            for o in &origins {
                allowed.push(settings::normalise_origin(o).ok_or_else(|| {
                    RunError::Usage(format!("--origin {o:?}: not an http(s) origin"))
                })?);
            }
            let site = settings::Site {
                key,
                allowed_origins: allowed,
                sample_rate,
                enabled: !disabled,
            };
            store.upsert(&site).await.map_err(failed)?;
            println!("site {} saved", site.key);
        }
        SitesCommand::List => {
            for s in store.fetch_all().await.map_err(failed)? {
                let origins = if s.allowed_origins.is_empty() {
                    "*".to_owned()
                } else {
                    s.allowed_origins.join(",")
                };
                println!(
                    "{}\t{}\tsample_rate={}\torigins={}",
                    s.key,
                    if s.enabled { "enabled" } else { "disabled" },
                    s.sample_rate,
                    origins
                );
            }
        }
        SitesCommand::Disable { key } | SitesCommand::Enable { key }
            if !beacon::is_site_key(&key) =>
        {
            return Err(RunError::Usage(format!("{key:?}: not a site key")));
        }
        SitesCommand::Disable { key } => set_enabled(&store, &key, false).await?,
        SitesCommand::Enable { key } => set_enabled(&store, &key, true).await?,
    }
    Ok(())
}

async fn set_enabled(
    store: &settings::SettingsStore,
    key: &str,
    enabled: bool,
) -> Result<(), RunError> {
    if store.set_enabled(key, enabled).await.map_err(failed)? {
        println!(
            "site {key} {}",
            if enabled { "enabled" } else { "disabled" }
        );
        Ok(())
    } else {
        Err(RunError::Failed(format!("no site {key:?}")))
    }
}
