//! `--crux` against the rows it reads: every figure of a mixed fixture, a Firefox-only site.

use super::*;

/// The whole `--crux` check on `env`: the fixture's answer, then a Firefox-only site.
async fn crux_answers_what_the_rows_say(env: &TestEnv<'_>) -> Value {
    let rows_made = today();
    let rows = crux_rows();
    insert(env, "shop", &rows).await;
    let report = report_json(env, "shop", &["--crux"]);
    let days: Vec<String> = field(&report, "days")
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(days.len(), 28);
    // Yesterday, as the command saw it: midnight may have passed since the rows were made.
    let yesterday = [utc_date(rows_made - DAY), utc_date(today() - DAY)];
    assert!(
        yesterday.contains(&days[27]),
        "{days:?}: the last complete day is yesterday"
    );
    let cohorts = field(&report, "cohorts").as_array().unwrap();
    assert_eq!(cohorts.len(), 8);
    let verdicts: Vec<&Value> = cohorts
        .iter()
        .map(|c| field(c, "core_web_vitals"))
        .collect();
    for c in cohorts {
        check_cohort(c, &rows, &days);
    }
    assert!(
        verdicts.contains(&&json!("pass"))
            && verdicts.contains(&&json!("fail"))
            && verdicts.contains(&&json!("not_enough_data")),
        "{verdicts:?}"
    );

    // A site whose visitors all use Firefox: no Chromium cohort has data.
    let fox: Vec<Row> = rows
        .iter()
        .map(|r| Row {
            agent: 8,
            ..r.clone()
        })
        .collect();
    insert(env, "fox", &fox).await;
    let fox_report = report_json(env, "fox", &["--crux"]);
    for c in field(&fox_report, "cohorts").as_array().unwrap() {
        assert_eq!(field(c, "core_web_vitals"), "not_enough_data", "{c}");
        assert_eq!(as_number(field(c, "measurements")), Some(0.0), "{c}");
        assert!(field(c, "metrics")
            .as_array()
            .unwrap()
            .iter()
            .all(|f| field(f, "p75").is_null()));
    }
    let table = env.cli(&["report", "--site", "fox", "--crux"]);
    table.success();
    assert!(
        table
            .stdout
            .contains("phone, hard navigations: Core Web Vitals not enough data."),
        "{}",
        table.stdout
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crux_answers_what_the_rows_say_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    crux_answers_what_the_rows_say(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crux_answers_what_the_rows_say_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    crux_answers_what_the_rows_say(&env).await;
    let table = env.cli(&["report", "--site", "shop", "--crux"]);
    table.success();
    println!("{}", table.stdout);
    let html = tempfile::tempdir().unwrap().keep().join("crux.html");
    env.cli(&[
        "report",
        "--site",
        "shop",
        "--crux",
        "--html",
        html.to_str().unwrap(),
    ])
    .success();
    screenshot(&env, &html, "crux-screenshot.png").await;
}
