//! Scenario 14: a RabbitMQ cluster of three nodes (quorum queues) whose lane leader is lost
//! mid-run — SIGKILLed and restarted, or partitioned from its clients — with three workers
//! spread over the nodes, each worker's URL listing every node.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::{spread, Size, DRAIN};
use crate::report::{judge, Row};
use crate::world::{now_ms, Backend, Settings, World};

/// How the leader is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loss {
    /// SIGKILL, then restarted once the others have taken over.
    Kill,
    /// Its proxy blackholed (connections open and silent) for the size's blackhole time.
    Partition,
}

/// A live node leading the lane's quorum queue (bounded wait: an election takes seconds).
async fn leader(w: &World) -> Option<usize> {
    let cluster = w.cluster.as_ref()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(i) = cluster.leader(&w.lane) {
            return Some(i);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Connections through every node's proxy but `except`'s.
fn elsewhere(w: &World, except: usize) -> usize {
    (0..w.node_proxies.len())
        .filter(|i| *i != except)
        .map(|i| w.node_proxies[i].live())
        .sum()
}

/// Scenario 14a/14b.
pub(super) async fn leader_lost(backend: Backend, size: Size, root: &Path, loss: Loss) -> Row {
    let mut w = World::new(backend, root, Settings::default()).await;
    for _ in 0..3 {
        w.spawn_worker();
    }
    // Long enough that the fault lands mid-run and the run outlives the take-over (a
    // partition is noticed by heartbeats, about 10 s later).
    let n = size.steady * if loss == Loss::Kill { 3 } else { 6 };
    w.enqueue_work(n, |k| spread(k, 200, 600)).await;
    while w.written() < w.sent.len() / 6 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let Some(lost) = leader(&w).await else {
        let mut j = judge(&w, scenario(loss), "-".into(), false, None);
        j.row.check(false, "no node lists a leader for the lane");
        let row = j.row;
        w.cleanup().await;
        return row;
    };
    let on_lost = w.node_proxies[lost].live();
    let before = elsewhere(&w, lost);
    let fault_at = now_ms();
    let cut = Instant::now();
    match loss {
        Loss::Kill => {
            if let Some(c) = w.cluster.as_mut() {
                c.nodes[lost].kill().await;
            }
        }
        Loss::Partition => w.node_proxies[lost].blackhole(),
    }
    // Its clients move: as many connections elsewhere as it carried (bounded).
    let limit = Duration::from_secs(60);
    while elsewhere(&w, lost) < before + on_lost && cut.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved = cut.elapsed();
    let moved_all = elsewhere(&w, lost) >= before + on_lost;
    // The first run started anywhere after the fault: the queue serves again.
    let mut faults = match loss {
        Loss::Kill => format!("SIGKILL the leader node ({on_lost} connections on it)"),
        Loss::Partition => format!(
            "blackhole the leader node's clients {} s ({on_lost} connections on it)",
            size.blackhole.as_secs()
        ),
    };
    match loss {
        Loss::Kill => {
            // Restarted while the run goes on: it rejoins the cluster.
            tokio::time::sleep(Duration::from_secs(3)).await;
            if let Some(c) = w.cluster.as_mut() {
                c.nodes[lost].restart().await;
            }
            faults.push_str(", restarted 3 s later");
        }
        Loss::Partition => {
            tokio::time::sleep(size.blackhole.saturating_sub(cut.elapsed())).await;
            w.node_proxies[lost].reset();
        }
    }
    // A kill is over at once (the restart is not a fault); a partition when it heals.
    let fault_end = if loss == Loss::Kill {
        fault_at
    } else {
        now_ms()
    };
    let drained = w.wait_written(DRAIN).await;
    let mut j = judge(&w, scenario(loss), faults, false, Some(fault_end));
    // The workers whose list starts with the lost node (worker `i` starts with node `i % 3`):
    // when each started a run again from another node (a run started before its connection
    // was found dead came from deliveries it already held).
    let moved_at = fault_at + moved.as_millis() as u64;
    let on_it: Vec<u32> = (0..w.workers.len())
        .filter(|i| i % w.node_proxies.len() == lost)
        .map(|i| w.workers[i].pid)
        .collect();
    let again: Vec<f64> = on_it
        .iter()
        .filter_map(|pid| {
            j.events
                .iter()
                .find(|e| e.kind == "start" && e.pid == *pid && e.at_ms >= moved_at)
                .map(|e| (e.at_ms - fault_at) as f64 / 1000.0)
        })
        .collect();
    j.row.notes.push(format!(
        "its clients on other nodes after {:.1} s; its workers ran tasks from them after {}",
        moved.as_secs_f64(),
        if again.is_empty() {
            "never".to_owned()
        } else {
            again
                .iter()
                .map(|s| format!("{s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    j.row.check(
        again.len() == on_it.len(),
        "a worker that was on the lost node never ran a task again",
    );
    j.row.check(drained, "not every task finished");
    j.row
        .check(on_lost > 0, "no worker was connected to the leader");
    j.row.check(
        moved_all,
        "the leader's clients did not move to other nodes within 60 s",
    );
    // SIGKILL: the connection drops at once; the first reconnect waits 100 ms, and each
    // node tried answers or refuses at once. Partition: heartbeats (5 s) notice it first.
    let bound = match loss {
        Loss::Kill => Duration::from_secs(5),
        Loss::Partition => Duration::from_secs(20),
    };
    j.row.check(
        moved <= bound,
        format!("its clients moved after {moved:?}, over {bound:?}"),
    );
    let row = j.row;
    w.cleanup().await;
    row
}

fn scenario(loss: Loss) -> &'static str {
    match loss {
        Loss::Kill => "14a. cluster: quorum leader node SIGKILLed and restarted",
        Loss::Partition => "14b. cluster: quorum leader node partitioned from its clients",
    }
}
