//! The raw Redis Streams baseline for `bench_e2e --broker redis`: the same task messages
//! added with `XADD`, read by a consumer group with `XREADGROUP` and removed with `XACK` +
//! `XDEL`, pipelined, with no store and no leases.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferriq::wire::TaskMessage;
use fred::prelude::{Builder, ClientLike, Config};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures_util::StreamExt;

fn command(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

/// Messages per second through `stream` on the Redis at `url`: `n` sent in batches of 100
/// (8 batches at once) while two consumers read 100 at a time and ack and delete each batch.
/// With `floor`, each consumer also writes, in the same pipeline, the two keys an exactly-once
/// result needs per message (a claim and a result, as ferriq's store writes them): the least
/// any exactly-once queue on this server does.
pub async fn raw_streams(url: &str, stream: &str, n: u64, floor: bool) -> f64 {
    let config = Config::from_url(url).expect("a Redis URL");
    let pool = Builder::from_config(config).build_pool(4).expect("a pool");
    pool.init().await.expect("Redis");
    let reader = Builder::from_config(Config::from_url(url).expect("a Redis URL"))
        .build()
        .expect("a client");
    reader.init().await.expect("Redis");
    let _: Value = pool
        .next()
        .custom(
            command("XGROUP"),
            vec!["CREATE", stream, "raw", "0", "MKSTREAM"],
        )
        .await
        .expect("XGROUP CREATE");
    let body = TaskMessage::new("bench.noop").to_json().expect("a message");
    let received = Arc::new(AtomicU64::new(0));
    // When the last message was acked: a consumer still blocked in its read then is not
    // part of the figure.
    let done_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let start = Instant::now();
    let consumers: Vec<_> = (0..2)
        .map(|i| {
            let (pool, received, stream) = (pool.clone(), received.clone(), stream.to_owned());
            let done_at = done_at.clone();
            let reader = reader.clone_new();
            tokio::spawn(async move {
                reader.init().await.expect("Redis");
                let blocking =
                    CustomCommand::new_static("XREADGROUP", ClusterHash::Offset(8), true);
                while received.load(Ordering::SeqCst) < n {
                    let reply: Value = reader
                        .custom(
                            blocking.clone(),
                            vec![
                                "GROUP".to_owned(),
                                "raw".to_owned(),
                                format!("c{i}"),
                                "COUNT".to_owned(),
                                "100".to_owned(),
                                "BLOCK".to_owned(),
                                "500".to_owned(),
                                "STREAMS".to_owned(),
                                stream.clone(),
                                ">".to_owned(),
                            ],
                        )
                        .await
                        .expect("XREADGROUP");
                    let ids: Vec<String> = reply
                        .into_array()
                        .into_iter()
                        .flat_map(|s| s.into_array().into_iter().nth(1))
                        .flat_map(Value::into_array)
                        .filter_map(|e| e.into_array().into_iter().next()?.as_string())
                        .collect();
                    if ids.is_empty() {
                        continue;
                    }
                    let mut ack = vec![stream.clone(), "raw".to_owned()];
                    ack.extend(ids.iter().cloned());
                    let mut del = vec![stream.clone()];
                    del.extend(ids.iter().cloned());
                    let pipeline = pool.next().pipeline();
                    if floor {
                        for id in &ids {
                            for kind in ["claim", "result"] {
                                let set = vec![
                                    format!("{stream}:floor:{kind}:{id}"),
                                    "r 1 1 1 0 1 0 raw".to_owned(),
                                    "PX".to_owned(),
                                    "60000".to_owned(),
                                ];
                                let _: () =
                                    pipeline.custom(command("SET"), set).await.expect("queued");
                            }
                        }
                    }
                    let _: () = pipeline.custom(command("XACK"), ack).await.expect("queued");
                    let _: () = pipeline.custom(command("XDEL"), del).await.expect("queued");
                    let _: Vec<Value> = pipeline.all().await.expect("XACK + XDEL");
                    let total =
                        received.fetch_add(ids.len() as u64, Ordering::SeqCst) + ids.len() as u64;
                    if total >= n {
                        let _ = done_at.set(Instant::now());
                    }
                }
                let _ = reader.quit().await;
            })
        })
        .collect();
    let batches: Vec<u64> = (0..n.div_ceil(100)).collect();
    futures_util::stream::iter(batches)
        .for_each_concurrent(8, |b| {
            let (pool, body, stream) = (pool.clone(), body.clone(), stream.to_owned());
            async move {
                let count = (n - b * 100).min(100);
                let pipeline = pool.next().pipeline();
                for _ in 0..count {
                    let args: Vec<Value> = vec![
                        stream.as_str().into(),
                        "*".into(),
                        "data".into(),
                        Value::from(body.as_slice()),
                    ];
                    let _: () = pipeline
                        .custom(command("XADD"), args)
                        .await
                        .expect("queued");
                }
                let _: Vec<Value> = pipeline.all().await.expect("XADD");
            }
        })
        .await;
    for c in consumers {
        c.await.expect("a consumer");
    }
    let end = done_at.get().copied().unwrap_or_else(Instant::now);
    let rate = n as f64 / end.duration_since(start).as_secs_f64();
    let _: Value = pool
        .next()
        .custom(command("DEL"), vec![stream])
        .await
        .expect("DEL");
    let _ = pool.quit().await;
    let _ = reader.quit().await;
    rate
}
