//! Claim+complete pairs per second with 64 concurrent tasks, beside raw EVALSHA of a trivial
//! script on the same pooled connections, measured in the same run (interleaved rounds).
//!
//! `cargo run --release -p ferriq-valkey --example bench [-- --url redis://… --secs 3 --rounds 3 --keep-keys]`
//!
//! The last line is `claim_complete_per_s=… raw_evalsha_per_s=… ratio=…` (ratio = pairs/s ÷ raw
//! calls/s; a pair is two scripts and a publish, so 0.5 would be parity per call).
//!
//! Each round also measures a floor: the two keys every pair must create (the claim and the
//! result, `SET NX PX` each, no script, no check, no publish) on a pool of the same size,
//! unbatched: what writing those keys costs with no logic at all, for scale.
//!
//! Throughput on two shared cores moves by ±15 % from round to round, so each round also prints
//! what the server itself spent per pair and per floor pair (µs, from `INFO commandstats`
//! before and after): a figure that does not depend on how busy the client was — and the server
//! process's whole CPU time per pair and per floor pair (`INFO cpu`), which adds what
//! commandstats leaves out: reading requests and writing replies, per round trip. Then 2000 pairs
//! one at a time, beside two bare `SET`s one at a time: the latency a lone task's claim and
//! complete add to its round trip.
//!
//! Every phase starts from a keyspace without the benchmark's keys: the keys each phase wrote
//! are deleted after it, outside the timing. Left in place, they grew the server's key table
//! across a power of two during a later phase, and that phase paid the whole table's rehash
//! (round 2's pairs, every run). `--keep-keys` keeps them, as the bench did before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferriq::store::{ClaimOutcome, ClaimStore, ResultStatus, ResultStore, StoreError, Token};
use ferriq::wire::{TaskId, TaskResult};
use ferriq_valkey::ValkeyStore;
use std::collections::HashMap;

use fred::cmd;
use fred::prelude::{ClientLike, Config, Expiration, KeysInterface, Pool, SetOptions};

const CONCURRENCY: usize = 64;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_owned())
}

/// Runs `op` from 64 tasks for `secs`; returns operations per second.
async fn measure<F, Fut>(secs: f64, op: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY as u64)
        .map(|t| {
            let (op, stop, count) = (op.clone(), stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    op(t * 1_000_000_000 + i).await;
                    i += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("bench task");
    }
    count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// `(calls, µs)` per command from the server's `INFO commandstats`: what the server itself
/// spent, unaffected by how busy the client or the machine was.
async fn commandstats(pool: &Pool) -> HashMap<String, (u64, u64)> {
    let info: String = pool
        .custom(cmd!("INFO"), vec!["commandstats", "cpu"])
        .await
        .unwrap_or_default();
    let mut stats = HashMap::new();
    // The server process's CPU time (seconds, µs precision), kept as `cpu` in µs: what it spent
    // in all, reading and writing its sockets included, which commandstats leaves out.
    let cpu_us: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    stats.insert("cpu".to_owned(), (0, (cpu_us * 1e6) as u64));
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        stats.insert(name.to_owned(), (field("calls="), field("usec=")));
    }
    stats
}

/// Calls and µs of `name` between two [`commandstats`] snapshots.
fn delta(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
    name: &str,
) -> (u64, u64) {
    let (c0, u0) = before.get(name).copied().unwrap_or_default();
    let (c1, u1) = after.get(name).copied().unwrap_or_default();
    (c1.saturating_sub(c0), u1.saturating_sub(u0))
}

/// Claims a task nobody has claimed; its fencing token.
async fn claim_fresh(store: &ValkeyStore, id: &TaskId) -> Result<Token, StoreError> {
    match store
        .claim(id, "bench", Duration::from_secs(30), None)
        .await?
    {
        ClaimOutcome::Run { token, .. } => Ok(token),
        other => panic!("fresh task not runnable: {other:?}"),
    }
}

/// One bare `SET key value NX PX 120000`: what the floor writes per key.
async fn set_nx(pool: &Pool, key: String, value: &str) -> Result<(), fred::error::Error> {
    let _: Option<String> = pool
        .set(
            key,
            value,
            Some(Expiration::PX(120_000)),
            Some(SetOptions::NX),
            false,
        )
        .await?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = arg(
        "--url",
        &std::env::var("FERRIQ_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    );
    let secs: f64 = arg("--secs", "3").parse()?;
    let rounds: usize = arg("--rounds", "3").parse()?;
    let pool: usize = arg("--pool", "4").parse()?;
    let keep_keys = std::env::args().any(|a| a == "--keep-keys");
    let prefix = format!("fqbench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let store = Arc::new(
        ValkeyStore::builder(url.as_str())
            .prefix(prefix.as_str())
            .pool_size(pool)
            .result_ttl(Some(Duration::from_secs(120)))
            .claim_ttl(Duration::from_secs(120))
            .connect()
            .await?,
    );
    let trivial = Arc::new(ValkeyStore::trivial_script());
    store.raw_evalsha(&trivial).await?; // loads it
    let result = Arc::new(TaskResult::success(
        serde_json::json!(1),
        0.0,
        Default::default(),
    ));
    let reply_to = Arc::new(store.reply_channel().unwrap_or_default());
    let floor_pool = Arc::new(Pool::new(Config::from_url(&url)?, None, None, None, pool)?);
    floor_pool.init().await?;

    println!("valkey bench: {url_shown}, {CONCURRENCY} concurrent tasks, pool of {pool}, {rounds} rounds of {secs} s",
        url_shown = ferriq::SecretUrl::new(url.clone()));
    let (mut pairs, mut raws, mut floors) = (Vec::new(), Vec::new(), Vec::new());
    let mut over_floor = Vec::new();
    let (mut server_pairs, mut server_floors) = (Vec::new(), Vec::new());
    let (mut server_cpu_pairs, mut server_cpu_floors) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let raw = {
            let (store, trivial) = (store.clone(), trivial.clone());
            measure(secs, move |_| {
                let (store, trivial) = (store.clone(), trivial.clone());
                async move {
                    store.raw_evalsha(&trivial).await.expect("raw evalsha");
                }
            })
            .await
        };
        let before_pairs = commandstats(&floor_pool).await;
        let pair = {
            let (store, result, reply_to) = (store.clone(), result.clone(), reply_to.clone());
            measure(secs, move |_| {
                let (store, result, reply_to) = (store.clone(), result.clone(), reply_to.clone());
                async move {
                    let id = TaskId::random();
                    let token = claim_fresh(&store, &id).await.expect("claim");
                    store
                        .complete(&id, token, Some(&result), Some(&reply_to))
                        .await
                        .expect("complete");
                }
            })
            .await
        };
        let after_pairs = commandstats(&floor_pool).await;
        if !keep_keys {
            store.purge_prefix().await?;
        }
        // After the purge: its deletes are not the floor's cost.
        let before_floor = commandstats(&floor_pool).await;
        let floor = {
            let (pool, prefix) = (floor_pool.clone(), prefix.clone());
            measure(secs, move |n| {
                let (pool, prefix) = (pool.clone(), prefix.clone());
                async move {
                    for (kind, value) in [
                        ("claim", "r 1764430000000000 1764430030000000 0 0 0 bench"),
                        ("result", r#"{"is_err":false,"log":null,"return_value":1,"execution_time":0.0,"labels":{},"error":null}"#),
                    ] {
                        set_nx(&pool, format!("{prefix}:floor:{kind}:{n}"), value).await.expect("floor SET");
                    }
                }
            })
            .await
        };
        let after_floor = commandstats(&floor_pool).await;
        if !keep_keys {
            store.purge_prefix().await?;
        }
        // Every first claim asks once whether the task has a result (EXISTS): the pairs' count.
        let (completed, _) = delta(&before_pairs, &after_pairs, "exists");
        let (scripts, script_us) = delta(&before_pairs, &after_pairs, "evalsha");
        let (sets, set_us) = delta(&before_floor, &after_floor, "set");
        let pair_us = script_us as f64 / completed.max(1) as f64;
        let floor_us = 2.0 * set_us as f64 / sets.max(1) as f64;
        let (_, pair_cpu) = delta(&before_pairs, &after_pairs, "cpu");
        let (_, floor_cpu) = delta(&before_floor, &after_floor, "cpu");
        let pair_cpu = pair_cpu as f64 / completed.max(1) as f64;
        let floor_cpu = 2.0 * floor_cpu as f64 / sets.max(1) as f64;
        println!("round {round}: server µs per pair {pair_us:.2} (scripts; {:.3} script runs per pair), per floor pair {floor_us:.2} (two SETs); server CPU per pair {pair_cpu:.2}, per floor pair {floor_cpu:.2} (all of it, sockets included)",
            scripts as f64 / completed.max(1) as f64);
        server_cpu_pairs.push(pair_cpu);
        server_cpu_floors.push(floor_cpu);
        server_pairs.push(pair_us);
        server_floors.push(floor_us);
        println!("round {round}: raw EVALSHA {raw:>9.0}/s   claim+complete {pair:>9.0} pairs/s   ratio {:.3}   floor (2 × SET NX PX) {floor:>9.0} pairs/s   ratio {:.3}   pairs ÷ floor {:.3}", pair / raw, floor / raw, pair / floor);
        over_floor.push(pair / floor);
        raws.push(raw);
        pairs.push(pair);
        floors.push(floor);
    }

    // One pair at a time: what a lone task's claim and complete add to its round trip, beside
    // two bare SETs one at a time on the floor's pool.
    let (mut lone_pair, mut lone_floor) = (Vec::new(), Vec::new());
    for n in 0..2000u64 {
        let id = TaskId::random();
        let t = Instant::now();
        let token = claim_fresh(&store, &id).await?;
        store
            .complete(&id, token, Some(&result), Some(&reply_to))
            .await?;
        lone_pair.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        for kind in ["claim", "result"] {
            set_nx(&floor_pool, format!("{prefix}:lone:{kind}:{n}"), "1").await?;
        }
        lone_floor.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lone_pair.sort_by(|a, b| a.total_cmp(b));
    lone_floor.sort_by(|a, b| a.total_cmp(b));
    println!(
        "one pair at a time: claim+complete p50 {:.0} µs, p99 {:.0} µs; two SETs p50 {:.0} µs, p99 {:.0} µs (n=2000)",
        lone_pair[1000], lone_pair[1980], lone_floor[1000], lone_floor[1980]
    );

    // Wake-up latency of wait(): complete, then time until the waiter returns.
    let mut wake = Vec::new();
    for _ in 0..200 {
        let id = TaskId::random();
        let token = claim_fresh(&store, &id).await?;
        let waiter = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                let r = store.wait(&id, Duration::from_secs(10)).await;
                (Instant::now(), r)
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        store
            .complete(&id, token, Some(&result), Some(&reply_to))
            .await?;
        let done = Instant::now();
        let (woken, r) = waiter.await?;
        assert!(matches!(r?, ResultStatus::Ready(_)));
        wake.push(woken.saturating_duration_since(done).as_secs_f64() * 1e3);
    }
    wake.sort_by(|a, b| a.total_cmp(b));
    println!(
        "wait() wake-up after complete: p50 {:.3} ms, p99 {:.3} ms (n=200)",
        wake[100], wake[198]
    );
    let (pair, raw, floor) = (median(pairs), median(raws), median(floors));
    println!(
        "floor_pairs_per_s={floor:.0} floor_ratio={:.3} (two key writes, nothing else) median_pairs_over_floor={:.3} (per round)",
        floor / raw,
        median(over_floor)
    );
    println!(
        "server_us_per_pair={:.2} server_us_per_floor_pair={:.2} (median per round, from INFO commandstats)",
        median(server_pairs),
        median(server_floors)
    );
    println!(
        "server_cpu_us_per_pair={:.2} server_cpu_us_per_floor_pair={:.2} (median per round, from INFO cpu: sockets included)",
        median(server_cpu_pairs),
        median(server_cpu_floors)
    );
    println!(
        "claim_complete_per_s={pair:.0} raw_evalsha_per_s={raw:.0} ratio={:.3}",
        pair / raw
    );
    // Leave the shared server as it was.
    let purged = store.purge_prefix().await?;
    eprintln!("removed {purged} benchmark keys");
    store.close().await;
    let _ = floor_pool.quit().await;
    Ok(())
}
