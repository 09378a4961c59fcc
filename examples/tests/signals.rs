//! Signals: the first SIGTERM stops after the open batch commits; a second one exits at
//! once (status 130) without committing it: nothing of that batch becomes visible, and the
//! next start processes its records again. A signal while the engines start stops them
//! as cleanly.

mod common;

use std::time::{Duration, Instant};

use common::{Deployment, Running, committed};
use onceflow_testkit::{Isolation, OutgoingRecord};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_without_committing_the_open_batch() {
    let deployment = Deployment::new("stuck", &[("orders", 1), ("invoices", 1)], 10).await;
    let kafka = deployment.kafka;
    kafka
        .produce("orders", [OutgoingRecord::keyed("o1", r#"{"id":"o1"}"#)])
        .await
        .expect("produce");
    let mut run = deployment.start();

    // The handler has emitted its invoice and will not return.
    handled_o1(&run, 1).await;

    // First signal: a graceful stop waits for the batch, which does not end.
    run.signal_term().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        run.child.try_wait().expect("try_wait").is_none(),
        "the first signal must wait for the open batch; log:\n{}",
        run.log_text()
    );
    assert!(
        run.log_text().contains("signal again to exit at once"),
        "{}",
        run.log_text()
    );

    // Second signal: out now, with 130.
    run.signal_term().await;
    let status = tokio::time::timeout(Duration::from_secs(5), run.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no exit within 5 s of the second signal:\n{}",
                run.log_text()
            )
        })
        .expect("wait");
    assert_eq!(status.code(), Some(130), "{}", run.log_text());
    assert!(
        run.log_text().contains("second signal: exiting now"),
        "{}",
        run.log_text()
    );

    // Nothing of the batch committed: no invoice visible, no input offset committed…
    let visible = kafka
        .read_to_end("invoices", Isolation::ReadCommitted)
        .await
        .expect("read_committed");
    assert!(visible.is_empty(), "nothing of the open batch is visible");
    assert_eq!(committed(kafka, &deployment.group, "orders").await, 0);

    // …so the next start processes the record again.
    let run = deployment.start();
    handled_o1(&run, 2).await;
    run.kill().await;
}

/// A rollout may stop a pod that has only just started: the signal comes before the
/// engines run. A repeat run of issue 40 saw the process die of it (status "signal: 15",
/// the signal's default action: the runner listened only once the engines were made).
/// It is listened for from before the runner's first log line on, so this test sends it
/// then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_the_engines_start_stops_them_cleanly() {
    let topics = [("starting-orders", 1), ("starting-invoices", 1)];
    let deployment = Deployment::new("stuck", &topics, 10).await;
    let mut run = deployment.start_with(&[
        "--input",
        "starting-orders",
        "--output",
        "invoices=starting-invoices",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run.log_text().contains("onceflow runner") {
        assert!(
            Instant::now() < deadline,
            "no first line; log:\n{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    run.signal_term().await;
    let status = tokio::time::timeout(Duration::from_secs(30), run.child.wait())
        .await
        .unwrap_or_else(|_| panic!("no exit within 30 s of the signal:\n{}", run.log_text()))
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status}; log:\n{}", run.log_text());
}

/// Waits until the log shows the handler taking record o1 for the `times`th time.
async fn handled_o1(run: &Running, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.log_text().matches("stuck: handling o1").count() < times {
        assert!(
            Instant::now() < deadline,
            "the handler did not take o1 {times} time(s); log:\n{}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
