//! Acks asked for together are written together (one `multiple` ack for the oldest run of a
//! channel's deliveries): whatever the order of acks and releases, exactly the acked messages
//! leave the queue and exactly the released ones come back.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Topology;
use ferriq::broker::{Broker, Delivery, OutgoingMessage};
use ferriq::wire::TaskMessage;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);

async fn receive(broker: &ferriq_amqp::AmqpBroker, n: usize) -> Vec<Delivery> {
    let mut held = Vec::new();
    let deadline = Instant::now() + WAIT;
    while held.len() < n {
        assert!(Instant::now() < deadline, "{} of {n} arrived", held.len());
        held.extend(
            broker
                .receive(n - held.len(), Duration::from_millis(200))
                .await
                .unwrap(),
        );
    }
    held
}

fn ids(deliveries: &[Delivery]) -> BTreeSet<String> {
    deliveries
        .iter()
        .map(|d| d.task_id.as_ref().expect("the task_id header").to_string())
        .collect()
}

#[tokio::test]
async fn acks_and_releases_in_any_order_settle_exactly_what_each_asked() {
    const N: usize = 240;
    for seed in 0..3u64 {
        let topology = Topology::new();
        let broker = topology
            .builder(&common::amqp_url())
            .prefetch(N as u16)
            .connect()
            .await
            .unwrap();
        let msgs: Vec<_> = (0..N)
            .map(|_| OutgoingMessage::from_message(&TaskMessage::new("t")).unwrap())
            .collect();
        broker.publish(msgs).await.unwrap();
        let mut held = receive(&broker, N).await;
        held.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
        // Every fifth goes back to the queue; the others are acked, all at once from many
        // tasks, so acks come in bursts with releases between them.
        let (released, acked): (Vec<_>, Vec<_>) =
            held.into_iter().enumerate().partition(|(i, _)| i % 5 == 0);
        let released: Vec<Delivery> = released.into_iter().map(|(_, d)| d).collect();
        let acked: Vec<Delivery> = acked.into_iter().map(|(_, d)| d).collect();
        let mut settles = tokio::task::JoinSet::new();
        for (i, d) in released.iter().chain(&acked).enumerate() {
            let (broker, handle, release) = (broker.clone(), d.handle.clone(), i < released.len());
            settles.spawn(async move {
                if release {
                    broker.release(&handle, Duration::ZERO).await
                } else {
                    broker.ack(&handle).await
                }
            });
        }
        while let Some(settled) = settles.join_next().await {
            settled.unwrap().unwrap();
        }
        // The channel lived through it (a wrong `multiple` ack closes it, and every delivery
        // on it would come back): exactly the released ones return.
        let back = receive(&broker, released.len()).await;
        assert_eq!(ids(&back), ids(&released), "seed {seed}");
        for d in &back {
            broker.ack(&d.handle).await.unwrap();
        }
        // Every ack went out: the prefetch of N is free again, so N more all arrive (one ack
        // left unwritten would hold its slot, and the last of them would never come).
        let msgs: Vec<_> = (0..N)
            .map(|_| OutgoingMessage::from_message(&TaskMessage::new("t")).unwrap())
            .collect();
        broker.publish(msgs).await.unwrap();
        for d in receive(&broker, N).await {
            broker.ack(&d.handle).await.unwrap();
        }
        broker.close().await;
    }
}
