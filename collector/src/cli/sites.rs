//! `collector sites add|update|list|enable|disable|purge`: the `sites` table, through the
//! settings store.

use super::{cli_store, failed, RunError, SiteLists, SitesCommand};
use crate::beacon;
use crate::config::Config;
use crate::measurement::page_groups::presets;
use crate::settings::{self, Site};

/// Runs one `sites` subcommand.
pub async fn run(config: &Config, command: SitesCommand) -> Result<(), RunError> {
    let store = cli_store(config)?;
    match command {
        SitesCommand::Add {
            key,
            sample_rate,
            disabled,
            shard,
            lists,
        } => {
            check_key(&key)?;
            let existing = store.fetch(&key).await.map_err(failed)?;
            let shard = choose_shard(config, &key, shard.as_deref(), existing.as_ref())?;
            let mut site = Site {
                sample_rate: check_rate(sample_rate)?,
                enabled: !disabled,
                shard,
                ..Site::new(key)
            };
            apply_lists(&mut site, lists)?;
            store.upsert(&site).await.map_err(failed)?;
            println!("site {} saved on shard {}", site.key, site.shard);
        }
        SitesCommand::Update {
            key,
            sample_rate,
            lists,
        } => {
            check_key(&key)?;
            let mut site = store
                .fetch(&key)
                .await
                .map_err(failed)?
                .ok_or_else(|| RunError::Failed(format!("no site {key:?}")))?;
            if let Some(rate) = sample_rate {
                site.sample_rate = check_rate(rate)?;
            }
            apply_lists(&mut site, lists)?;
            store.upsert(&site).await.map_err(failed)?;
            println!("site {} updated", site.key);
        }
        SitesCommand::List => {
            for s in store.fetch_all().await.map_err(failed)? {
                println!("{}", describe(&s));
            }
        }
        SitesCommand::Disable { key } => set_enabled(&store, &key, false).await?,
        SitesCommand::Enable { key } => set_enabled(&store, &key, true).await?,
        SitesCommand::Purge { key } => {
            check_key(&key)?;
            super::purge::run(config, &store, &key).await?;
        }
    }
    Ok(())
}

/// The shard of a site being added (contract v5 §3): an existing site's own (a `--shard` that
/// differs is refused: a site never moves by itself), else `--shard` when it is a configured
/// shard, else [`settings::place`] over the configured shards.
fn choose_shard(
    config: &Config,
    key: &str,
    wanted: Option<&str>,
    existing: Option<&Site>,
) -> Result<String, RunError> {
    let names: Vec<&str> = config
        .clickhouse
        .shards
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    match (existing, wanted) {
        (Some(site), Some(w)) if w != site.shard => Err(RunError::Failed(format!(
            "site {key} lives on shard {}: a site's shard is chosen once and never changed by sites add (docs/operations.md, \"Moving a site\")",
            site.shard
        ))),
        (Some(site), _) => Ok(site.shard.clone()),
        (None, Some(w)) if names.contains(&w) => Ok(w.to_owned()),
        (None, Some(w)) => Err(RunError::Usage(format!(
            "--shard {w:?}: not a configured shard (COLLECTOR_CLICKHOUSE_SHARDS names {})",
            names.join(", ")
        ))),
        (None, None) => Ok(settings::place(key, &names).to_owned()),
    }
}

/// One line of `sites list`.
fn describe(s: &Site) -> String {
    let list = |l: &[String], empty: &str| {
        if l.is_empty() {
            empty.to_owned()
        } else {
            l.join(",")
        }
    };
    format!(
        "{}\t{}\tsample_rate={}\torigins={}\tkeep_query={}\tpage_groups={}\tdimensions={}\tshard={}\ttrusted_proxies={}",
        s.key,
        if s.purged {
            "purged"
        } else if s.enabled {
            "enabled"
        } else {
            "disabled"
        },
        s.sample_rate,
        list(&s.allowed_origins, "*"),
        list(&s.keep_query, "(none)"),
        list(&s.page_groups, "(none)"),
        list(&s.dimensions, "(none)"),
        s.shard,
        list(&s.trusted_proxies, "(none)"),
    )
}

fn check_key(key: &str) -> Result<(), RunError> {
    if beacon::is_site_key(key) {
        Ok(())
    } else {
        Err(RunError::Usage(format!(
            "{key:?}: a site key is 1 to 64 characters from A-Za-z0-9._-"
        )))
    }
}

/// `--sample-rate`: from [`settings::MIN_CONFIGURED_RATE`] to 1 (exit 2 otherwise; NaN too).
fn check_rate(rate: f64) -> Result<f64, RunError> {
    if (settings::MIN_CONFIGURED_RATE..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(RunError::Usage(format!(
            "--sample-rate {rate}: must be from {} to 1 \
             (to stop collecting for a site, use --disabled)",
            settings::MIN_CONFIGURED_RATE
        )))
    }
}

/// Replaces each list of `site` that `lists` gives, every value checked (exit 2 naming the
/// first bad one). A preset makes the page-group rules those given, then the preset's.
fn apply_lists(site: &mut Site, lists: SiteLists) -> Result<(), RunError> {
    fn usage(flag: &str, value: &str, e: impl std::fmt::Display) -> RunError {
        RunError::Usage(format!("--{flag} {value:?}: {e}"))
    }
    if let Some(origins) = lists.origins {
        site.allowed_origins = origins
            .iter()
            .map(|o| {
                settings::normalise_origin(o)
                    .ok_or_else(|| usage("origin", o, "not an http(s) origin"))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(keep) = lists.keep_query {
        let keep: Vec<String> = keep.into_iter().filter(|k| !k.is_empty()).collect();
        for k in &keep {
            settings::check_keep_query(k).map_err(|e| usage("keep-query", k, e))?;
        }
        site.keep_query = keep;
    }
    let mut page_groups = lists.page_groups;
    if let Some(preset) = lists.page_groups_preset {
        let rules = presets::rules(&preset)
            .ok_or_else(|| usage("page-groups-preset", &preset, "not a preset"))?;
        let mut groups = page_groups.unwrap_or_default();
        groups.extend(rules.iter().map(|r| r.to_string()));
        page_groups = Some(groups);
    }
    if let Some(groups) = page_groups {
        // `--page-group ''` clears the list, as `--keep-query ''` does.
        let groups: Vec<String> = groups.into_iter().filter(|g| !g.is_empty()).collect();
        settings::check_page_groups(&groups)
            .map_err(|e| usage("page-group", &format!("{} rules", groups.len()), e))?;
        site.page_groups = groups;
    }
    if let Some(dimensions) = lists.dimensions {
        let dimensions: Vec<String> = dimensions.into_iter().filter(|d| !d.is_empty()).collect();
        settings::check_dimensions(&dimensions)
            .map_err(|e| usage("dimension", &dimensions.join(","), e))?;
        site.dimensions = dimensions;
    }
    if let Some(proxies) = lists.trusted_proxies {
        let proxies: Vec<String> = proxies.into_iter().filter(|p| !p.is_empty()).collect();
        let nets = settings::check_trusted_proxies(&proxies)
            .map_err(|e| usage("trusted-proxy", &proxies.join(","), e))?;
        // Stored as parsed: `203.0.113.7` as `203.0.113.7/32`.
        site.trusted_proxies = nets.iter().map(ToString::to_string).collect();
    }
    Ok(())
}

async fn set_enabled(
    store: &settings::SettingsStore,
    key: &str,
    enabled: bool,
) -> Result<(), RunError> {
    check_key(key)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lists(groups: Option<&[&str]>, preset: Option<&str>) -> SiteLists {
        SiteLists {
            origins: None,
            keep_query: None,
            page_groups: groups.map(|g| g.iter().map(|s| s.to_string()).collect()),
            page_groups_preset: preset.map(str::to_owned),
            dimensions: None,
            trusted_proxies: None,
        }
    }

    #[test]
    fn trusted_proxies_are_stored_as_networks_and_checked() {
        let mut site = Site::new("s");
        let with = |p: &[&str]| SiteLists {
            trusted_proxies: Some(p.iter().map(|s| s.to_string()).collect()),
            ..lists(None, None)
        };
        apply_lists(&mut site, with(&["203.0.113.7", "2001:db8::/48"])).unwrap();
        assert_eq!(site.trusted_proxies, ["203.0.113.7/32", "2001:db8::/48"]);
        let bad = apply_lists(&mut site, with(&["203.0.113.0/33"])).unwrap_err();
        assert!(
            matches!(&bad, RunError::Usage(m) if m.contains("--trusted-proxy")),
            "{bad:?}"
        );
        let many: Vec<String> = (0..17).map(|i| format!("203.0.113.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(apply_lists(&mut site, with(&many)).is_err(), "at most 16");
        assert_eq!(
            site.trusted_proxies.len(),
            2,
            "a refused list changes nothing"
        );
        apply_lists(&mut site, with(&[""])).unwrap();
        assert!(site.trusted_proxies.is_empty(), "'' clears them");
    }

    #[test]
    fn a_preset_follows_the_sites_own_rules() {
        let mut site = Site::new("s");
        apply_lists(
            &mut site,
            lists(Some(&["sale=/products/sale-*"]), Some("shopify")),
        )
        .unwrap();
        assert_eq!(site.page_groups[0], "sale=/products/sale-*");
        assert_eq!(site.page_groups[1..], *presets::SHOPIFY);

        apply_lists(&mut site, lists(None, Some("woocommerce"))).unwrap();
        assert_eq!(
            site.page_groups,
            *presets::WOOCOMMERCE,
            "a preset alone replaces the rules"
        );

        apply_lists(&mut site, lists(None, None)).unwrap();
        assert_eq!(
            site.page_groups,
            *presets::WOOCOMMERCE,
            "nothing given keeps them"
        );

        let bad = apply_lists(&mut site, lists(Some(&["p=/**/x"]), Some("magento")));
        assert!(matches!(bad, Err(RunError::Usage(_))));
        let unknown = apply_lists(&mut site, lists(None, Some("prestashop")));
        assert!(matches!(unknown, Err(RunError::Usage(_))));

        apply_lists(&mut site, lists(Some(&[""]), None)).unwrap();
        assert!(site.page_groups.is_empty(), "--page-group '' clears them");
    }

    #[test]
    fn an_empty_dimension_clears_them() {
        let mut site = Site::new("s");
        let mut l = lists(None, None);
        l.dimensions = Some(vec!["variant".into()]);
        apply_lists(&mut site, l).unwrap();
        assert_eq!(site.dimensions, ["variant"]);
        let mut l = lists(None, None);
        l.dimensions = Some(vec![String::new()]);
        apply_lists(&mut site, l).unwrap();
        assert!(site.dimensions.is_empty());
    }
}
