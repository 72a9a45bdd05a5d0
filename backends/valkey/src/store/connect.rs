//! Making a store: the pool and the subscriber connected, the scripts loaded and the server
//! checked, the reply channel subscribed — all within a bound, and nothing left reconnecting
//! when it fails — then the batching tasks started (on a single server).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ferriq::store::{ClaimOutcome, CompleteOutcome, StoreError};
use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, ClientState, Pool, PubsubInterface};
use fred::types::ConnectHandle;
use tokio::task::JoinHandle;

use super::{FlowBatchers, Inner, ValkeyStore};
use crate::batch::Batcher;
use crate::claims::{ClaimCall, CompleteCall, Core};
use crate::gate::GateKind;
use crate::keys::Keys;
use crate::limiter_keys::KeyCache;
use crate::scripts::{self, Scripts};
use crate::waiters::{confirm_subscribed, spawn_dispatcher, Waiters};
use crate::{ValkeyError, ValkeyStoreBuilder};

/// Calls gathered into one script run at most.
const MAX_BATCH: usize = 64;

impl ValkeyStore {
    pub(crate) async fn connect(settings: ValkeyStoreBuilder) -> Result<Self, ValkeyError> {
        let builder = settings.fred_builder()?;
        let failed = |e: fred::error::Error| connect_error(&settings, &e);
        let pool = builder.build_pool(settings.pool_size).map_err(failed)?;
        let subscriber = settings
            .fred_subscriber_builder()?
            .build_subscriber_client()
            .map_err(failed)?;
        let (waiters, leaves) = Waiters::new(subscriber.clone());
        let waiters = Arc::new(waiters);
        let keys = Keys::new(&settings.prefix);
        let reply_channel = keys.reply_channel();
        let scripts = Scripts::new();
        let limit = settings.connect_timeout.saturating_mul(2) + Duration::from_secs(1);
        let mut background = Vec::new();
        let mut routers = Vec::new();
        let setup = async {
            // One handle per connection (not the pool's single one), so each can be awaited
            // at close and aborted at a drop.
            let inits = futures_util::future::join_all(pool.clients().iter().map(|c| c.init()));
            let mut failed = None;
            for init in inits.await {
                match init {
                    Ok(router) => routers.push(router),
                    Err(e) => failed = failed.or(Some(e)),
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            routers.push(subscriber.init().await?);
            scripts.load(pool.next()).await?;
            scripts::check_server(pool.next())
                .await
                .map_err(|e| fred::error::Error::new(fred::error::ErrorKind::Config, e))?;
            // The dispatcher listens for reconnects before the first subscription and
            // resubscribes itself, so a drop right after it is covered too. (Not fred's
            // `manage_subscriptions`: its `resubscribe_all` sends an empty PSUBSCRIBE, whose
            // error then answers the next command, our confirming PING.)
            background.push(spawn_dispatcher(&subscriber, Arc::clone(&waiters), leaves));
            subscriber.subscribe(reply_channel.as_str()).await?;
            confirm_subscribed(&subscriber).await?;
            Ok::<_, fred::error::Error>(())
        };
        let outcome = match tokio::time::timeout(limit, setup).await {
            Ok(r) => r.map_err(failed),
            Err(_) => Err(ValkeyError::Connect {
                url: settings.url.redacted(),
                reason: format!("no answer within {limit:?}"),
            }),
        };
        if let Err(e) = outcome {
            give_up(&background, &pool, &subscriber, routers).await;
            return Err(e);
        }
        let clustered = pool.next().is_clustered();
        tracing::info!(url = %settings.url.redacted(), prefix = %settings.prefix, "valkey store connected");
        let parallel = settings.pool_size;
        let core = Arc::new(Core {
            pool,
            scripts,
            keys,
            settings,
            worker: Default::default(),
        });
        // In a cluster one script may only touch one slot: every call goes alone.
        let batchers = (!clustered).then(|| Batchers::spawn(&core, parallel));
        let (claims, completes, reads, flow) = match batchers {
            Some(b) => {
                background.extend(b.tasks);
                (
                    Some(b.claims),
                    Some(b.completes),
                    Some(b.reads),
                    Some(b.flow),
                )
            }
            None => (None, None, None, None),
        };
        Ok(ValkeyStore {
            inner: Arc::new(Inner {
                core,
                subscriber,
                waiters,
                reply_channel,
                clustered,
                claims,
                completes,
                reads,
                flow,
                flow_keys: KeyCache::default(),
                background,
                routers: std::sync::Mutex::new(routers),
                closed: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

/// A connection that failed, as an error that says what to fix: the URL (its password
/// hidden), fred's reason, and for a refused permission or a TLS failure the likely cause.
fn connect_error(settings: &ValkeyStoreBuilder, e: &fred::error::Error) -> ValkeyError {
    let tls =
        settings.url.scheme().starts_with("rediss") || settings.url.scheme().starts_with("valkeys");
    let details = e.details().to_owned();
    let mut reason = settings
        .url
        .explain(format_args!("{:?}: {details}", e.kind()));
    let noperm = details
        .contains("NOPERM")
        .then_some(crate::error::NOPERM_HINT);
    // With TLS 1.3 a server refusing the client's certificate may close the connection
    // before its alert is read.
    let lower = details.to_ascii_lowercase();
    let reset = tls && (lower.contains("connection reset") || lower.contains("broken pipe"));
    let noperm = noperm.or(reset.then_some(
        "the server closed the TLS connection during the handshake: if it asks for client certificates, set FERRIQ_STORE_TLS_CERT and FERRIQ_STORE_TLS_KEY (builder: tls_client_cert) to one signed by a CA it trusts; if the port is a plain one, use the server's TLS port (a plain port does not speak TLS)",
    ));
    let hint = noperm
        .or_else(|| crate::tls::explain(&format!("{:?} {details}", e.kind())))
        .or_else(|| {
            // A plain port reads a TLS hello as the start of a command and never answers.
            (tls && *e.kind() == fred::error::ErrorKind::Timeout).then_some(
                "no TLS handshake answered: check that the port is the server's TLS port (a plain port does not speak TLS) and that it is reachable",
            )
        });
    if let Some(hint) = hint {
        reason = format!("{reason} — {hint}");
    }
    ValkeyError::Connect {
        url: settings.url.redacted(),
        reason,
    }
}

/// After a failed connect: nothing may keep reconnecting in the background for a store that
/// was never made.
async fn give_up(
    background: &[JoinHandle<()>],
    pool: &Pool,
    subscriber: &SubscriberClient,
    routers: Vec<ConnectHandle>,
) {
    for task in background {
        task.abort();
    }
    quit_connected(pool, subscriber).await;
    for router in routers {
        router.abort();
    }
}

/// After a failed connect: closes the clients that are not disconnected. `quit` on a client
/// that never connected (its router stopped when `init` failed) only logs fred's warning
/// "attempted to quit client that was already stopped", once per connection. (Not used when a
/// store is closed or dropped: a disconnected client there may be between reconnect attempts,
/// and skipping its `quit` would leave it reconnecting for good.)
async fn quit_connected(pool: &Pool, subscriber: &SubscriberClient) {
    if subscriber.state() != ClientState::Disconnected {
        let _ = subscriber.quit().await;
    }
    for client in pool.clients() {
        if client.state() != ClientState::Disconnected {
            let _ = client.quit().await;
        }
    }
}

/// The batching tasks of a store on a single server, and the tasks running them.
struct Batchers {
    claims: Batcher<ClaimCall, ClaimOutcome>,
    completes: Batcher<CompleteCall, CompleteOutcome>,
    reads: Batcher<String, Option<String>>,
    flow: FlowBatchers,
    tasks: Vec<JoinHandle<()>>,
}

impl Batchers {
    /// One batcher per script, each with at most `parallel` batches on the wire (a
    /// connection each).
    fn spawn(core: &Arc<Core>, parallel: usize) -> Batchers {
        let mut tasks = Vec::new();
        let claims = batcher(core, parallel, &mut tasks, |c, calls| async move {
            c.claim_many(calls).await
        });
        let completes = batcher(core, parallel, &mut tasks, |c, calls| async move {
            c.complete_many(calls).await
        });
        let reads = batcher(core, parallel, &mut tasks, |c, keys| async move {
            c.read_many(keys).await
        });
        let flow = FlowBatchers {
            admits: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.admit_many(calls).await
            }),
            acquires: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.acquire_many(calls).await
            }),
            releases: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.release_many(calls).await
            }),
            admit_claims: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.gated_many(GateKind::Rate, calls).await
            }),
            acquire_claims: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.gated_many(GateKind::Slot, calls).await
            }),
            complete_freeings: batcher(core, parallel, &mut tasks, |c, calls| async move {
                c.complete_freeing_many(calls).await
            }),
        };
        Batchers {
            claims,
            completes,
            reads,
            flow,
            tasks,
        }
    }
}

/// A batcher of `run` over the store's core, its task kept in `tasks` to be stopped with the
/// store.
fn batcher<I, O, Run, Ran>(
    core: &Arc<Core>,
    parallel: usize,
    tasks: &mut Vec<JoinHandle<()>>,
    run: Run,
) -> Batcher<I, O>
where
    I: Send + 'static,
    O: Send + 'static,
    Run: Fn(Arc<Core>, Vec<I>) -> Ran + Send + Sync + 'static,
    Ran: Future<Output = Result<Vec<Result<O, StoreError>>, StoreError>> + Send + 'static,
{
    let core = Arc::clone(core);
    let (batcher, task) = Batcher::spawn(MAX_BATCH, parallel, move |calls| {
        run(Arc::clone(&core), calls)
    });
    tasks.push(task);
    batcher
}
