//! Beacons sent to a collector while a test breaks things: a steady stream or a flood, and
//! what was answered.

use std::time::Duration;

use super::{measurement, wait_until, Collector, Diag};

/// What a [`Traffic`] run saw.
#[derive(Debug, Default, Clone)]
pub struct TrafficReport {
    /// Ids answered 202.
    pub acked: Vec<String>,
    /// Count of answers by status (0: no answer, e.g. connection refused).
    pub statuses: std::collections::BTreeMap<u16, usize>,
    /// 503 answers that lacked `Retry-After`.
    pub unavailable_without_retry_after: usize,
    /// Resends of a 503 `spool write timed out` (see [`send_beacon`]).
    pub resent_after_slow_disk: usize,
}

/// POSTs one beacon `body` as a browser's script does; a 503 `spool write timed out` (a disk
/// saturated by the machine's other work) is resent after its `Retry-After`, at most twice,
/// as the script resends it. The last answer's status (0: no answer) and whether it had
/// `Retry-After`, and how many such resends it took.
async fn send_beacon(client: &reqwest::Client, url: &str, body: &str) -> (u16, bool, usize) {
    let mut resent = 0;
    loop {
        let answer = client
            .post(url)
            .header("content-type", "text/plain")
            .header("origin", "https://shop.example")
            .body(body.to_owned())
            .send()
            .await;
        let Ok(r) = answer else {
            return (0, false, resent);
        };
        let status = r.status().as_u16();
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let slow_disk = status == 503
            && resent < 2
            && r.text()
                .await
                .is_ok_and(|t| t.contains("spool write timed out"));
        match retry_after {
            Some(wait) if slow_disk => {
                resent += 1;
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            _ => return (status, retry_after.is_some(), resent),
        }
    }
}

impl TrafficReport {
    /// Counts the answer to the beacon `id` (`status` 0: no answer), whether it had
    /// `Retry-After`, and its resends after a slow disk's 503; returns the status.
    fn record(&mut self, id: String, (status, retry_after, resent): (u16, bool, usize)) -> u16 {
        self.resent_after_slow_disk += resent;
        *self.statuses.entry(status).or_default() += 1;
        if status == 202 {
            self.acked.push(id);
        }
        if status == 503 && !retry_after {
            self.unavailable_without_retry_after += 1;
        }
        status
    }
}

/// A steady stream of single measurements with unique ids, one every `interval`.
pub struct Traffic {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<TrafficReport>,
    report: SharedReport,
    diag: Diag,
}

/// A [`TrafficReport`] its senders record in while it is read.
type SharedReport = std::sync::Arc<std::sync::Mutex<TrafficReport>>;

impl Traffic {
    /// Starts posting to collector `c` for `site`.
    pub fn start(c: &Collector, site: &str, interval: Duration) -> Traffic {
        let site = site.to_owned();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        Traffic::run(c, move |url, shared, mut stopped| async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut inflight = futures::stream::FuturesUnordered::new();
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let (id, m) = measurement(&site);
                        // With an Origin, as every browser POST has (requests without one draw on a small budget).
                        let (client, url, shared) = (client.clone(), url.clone(), shared.clone());
                        inflight.push(async move {
                            let answer = send_beacon(&client, &url, &m.to_string()).await;
                            shared.lock().unwrap().record(id, answer);
                        });
                    }
                    Some(()) = futures::StreamExt::next(&mut inflight), if !inflight.is_empty() => {}
                    _ = stopped.changed() => break,
                }
            }
            while futures::StreamExt::next(&mut inflight).await.is_some() {}
        })
    }

    /// Starts `senders` clients posting to `base_url` for `site` back to back, each its next
    /// beacon as soon as the last is answered: the collector's maximum rate for that many
    /// connections. A request without an answer (the collector killed) counts under 0.
    pub fn flood(c: &Collector, site: &str, senders: usize) -> Traffic {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(senders)
            .build()
            .unwrap();
        Traffic::run(c, |url, report, stopped| {
            let tasks: Vec<_> = (0..senders)
                .map(|_| {
                    let (client, url, site, shared) =
                        (client.clone(), url.clone(), site.to_owned(), report.clone());
                    let stopped = stopped.clone();
                    tokio::spawn(async move {
                        while !*stopped.borrow() {
                            let (id, m) = measurement(&site);
                            let answer = send_beacon(&client, &url, &m.to_string()).await;
                            let status = shared.lock().unwrap().record(id, answer);
                            if status == 0 {
                                // Refused while the collector is down: not a busy loop.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    })
                })
                .collect();
            async move {
                for t in tasks {
                    t.await.unwrap();
                }
            }
        })
    }

    /// The traffic of `senders` to collector `c`: they are given its intake URL, the report
    /// to record each answer in and the signal to stop on, and what they return runs on a task
    /// of its own, which ends with the report once it is done.
    fn run<F, Fut>(c: &Collector, senders: F) -> Traffic
    where
        F: FnOnce(String, SharedReport, tokio::sync::watch::Receiver<bool>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let report = SharedReport::default();
        let sending = senders(
            format!("{}/api/v1/measurements", c.url),
            report.clone(),
            stopped,
        );
        let shared = report.clone();
        let task = tokio::spawn(async move {
            sending.await;
            let rep = shared.lock().unwrap().clone();
            rep
        });
        Traffic {
            stop,
            task,
            report,
            diag: c.diag.clone(),
        }
    }

    /// What was seen so far.
    pub fn snapshot(&self) -> TrafficReport {
        self.report.lock().unwrap().clone()
    }

    /// Waits until at least `n` more ids were acknowledged than now (at most `limit`).
    pub async fn wait_acked(&self, n: usize, limit: Duration) {
        let target = self.snapshot().acked.len() + n;
        wait_until(
            &self.diag,
            &format!("{n} more beacons acknowledged"),
            limit,
            Duration::from_millis(50),
            || async {
                let now = self.snapshot();
                if now.acked.len() >= target {
                    Ok(())
                } else {
                    Err(format!(
                        "{} of {n} acknowledged; answers so far {:?}",
                        n + now.acked.len() - target,
                        now.statuses
                    ))
                }
            },
        )
        .await
    }

    /// Stops and returns the report.
    pub async fn stop(self) -> TrafficReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap()
    }
}
