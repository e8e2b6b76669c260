//! The test helpers fail loudly on what they cannot find.

use super::*;

/// The helpers fail loudly: a metric that is not there is not 0, rows that never come are
/// not an empty answer, a column that is not there is not NULL, a log without levels has no
/// "no warnings", a collector that does not answer has no status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helpers_fail_loudly_on_what_they_cannot_find() {
    use futures::FutureExt;
    let env = TestEnv::new(Stack::shared()).await;
    let mut c = env.collector(&[]).await;
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 0.0);
    let misspelt = std::panic::AssertUnwindSafe(c.metric("collector_measurement_accepted_total"))
        .catch_unwind()
        .await;
    assert!(misspelt.is_err(), "a misspelt metric must not read as 0");
    let never = std::panic::AssertUnwindSafe(env.wait_rows(
        &[uuid::Uuid::new_v4().to_string()],
        Duration::from_millis(300),
    ))
    .catch_unwind()
    .await;
    assert!(never.is_err(), "rows that never come must fail the wait");

    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    let rows = env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;
    assert_eq!(
        col(&rows[0], "ts"),
        &Value::Null,
        "a NULL column reads as NULL"
    );
    let missing = std::panic::catch_unwind(|| col(&rows[0], "no_such_column").clone());
    assert!(missing.is_err(), "a missing column must not read as NULL");
    let missing = std::panic::catch_unwind(|| field(&json!({"accepted": 1}), "duplicates").clone());
    assert!(missing.is_err(), "a missing field must not read as null");

    // A collector's log carries levels: warning_lines reads it.
    warning_lines(&c.logs());
    let unparsed = std::panic::catch_unwind(|| warning_lines("").len());
    assert!(
        unparsed.is_err(),
        "an empty log must not read as no warnings"
    );
    let unparsed = std::panic::catch_unwind(|| warning_lines(r#"{"level":"WARN"}"#).len());
    assert!(
        unparsed.is_err(),
        "a log in another format must not read as no warnings"
    );

    c.kill().await;
    let unanswered = std::panic::AssertUnwindSafe(c.status_of("/readyz"))
        .catch_unwind()
        .await;
    assert!(unanswered.is_err(), "no answer must not read as a status");
}
