//! Middleware on the embedded engine (no servers): an error reporter (what a Sentry
//! integration does: every failed run reported once, with its task, attempt and tenant) and
//! a tenant context (the caller's tenant carried as a label, handed to the task as an
//! extension, refused when missing).
//!
//! `cargo run -p ferriq-examples --example middleware`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferriq::middleware::{AfterError, Middleware, MiddlewareError, Run};
use ferriq::task::AppState;
use ferriq::testing::TestEnv;
use ferriq::wire::TaskMessage;
use ferriq::{TaskContext, TaskError};

/// The tenant a task runs for.
#[derive(Debug, Clone)]
struct Tenant(String);

tokio::task_local! {
    /// Set by the app around the code that serves one tenant (an HTTP handler, say).
    static TENANT: String;
}

/// Carries the tenant from the caller's scope to the task.
struct TenantContext;

#[ferriq::async_trait]
impl Middleware for TenantContext {
    async fn before_send(&self, message: &mut TaskMessage) -> Result<(), MiddlewareError> {
        let tenant = TENANT
            .try_with(Clone::clone)
            .map_err(|_| MiddlewareError::new("enqueued outside a tenant's scope"))?;
        message.labels.insert("tenant", tenant);
        Ok(())
    }

    async fn before_run(&self, run: &Run<'_>, ext: &mut AppState) -> Result<(), MiddlewareError> {
        if let Some(tenant) = run.labels.get("tenant").and_then(|v| v.as_str()) {
            ext.insert(Tenant(tenant.to_owned()));
        }
        Ok(())
    }
}

/// Reports failures to an error tracker (here: a list; a Sentry client in an app).
#[derive(Default)]
struct ErrorReporter {
    reports: Mutex<Vec<String>>,
}

#[ferriq::async_trait]
impl Middleware for ErrorReporter {
    async fn on_error(&self, run: &Run<'_>, error: &TaskError, next: AfterError) {
        let tenant = run
            .labels
            .get("tenant")
            .and_then(|v| v.as_str())
            .unwrap_or("-");
        let next = match next {
            AfterError::Retry(after) => format!("retried in {after:?}"),
            _ => "gave up".to_owned(),
        };
        self.reports.lock().unwrap().push(format!(
            "{} attempt {}/{} for tenant {tenant}: {error} ({next})",
            run.task_name, run.attempt, run.max_attempts
        ));
    }
}

#[ferriq::task(name = "billing.invoice", max_attempts = 2, backoff_initial = 0.05)]
async fn invoice(ctx: TaskContext, amount: u32) -> Result<String, TaskError> {
    let tenant = ctx
        .extension::<Tenant>()
        .map(|t| t.0.clone())
        .unwrap_or_default();
    if amount == 0 {
        return Err(TaskError::fatal("an invoice of 0 is a bug upstream"));
    }
    if ctx.attempt() == 1 && amount > 100 {
        return Err(TaskError::retryable("the payment gateway timed out"));
    }
    Ok(format!("invoice of {amount} for {tenant}"))
}

#[tokio::main]
async fn main() {
    let env = TestEnv::new();
    let reporter = Arc::new(ErrorReporter::default());
    let client = env.client.clone().with_middleware(Arc::new(TenantContext));
    let worker = env.spawn_worker(
        env.worker()
            .registry(
                ferriq::Registry::from_inventory()
                    .unwrap()
                    .only(&[invoice::NAME])
                    .unwrap(),
            )
            .middleware(Arc::new(TenantContext))
            .middleware(reporter.clone())
            .config({
                let mut c = ferriq::WorkerConfig::default();
                c.min_defer = Duration::from_millis(50);
                c
            }),
    );
    let wait = Duration::from_secs(10);
    let (ok, flaky, bad) = TENANT
        .scope("acme".to_owned(), async {
            (
                client.enqueue(invoice::call(40)).await.unwrap(),
                client.enqueue(invoice::call(250)).await.unwrap(),
                client.enqueue(invoice::call(0)).await.unwrap(),
            )
        })
        .await;
    println!("ok      -> {}", ok.wait(wait).await.unwrap());
    println!("flaky   -> {}", flaky.wait(wait).await.unwrap());
    println!("bad     -> {}", bad.wait(wait).await.unwrap_err());
    match client.enqueue(invoice::call(1)).await {
        Err(e) => println!("no tenant -> refused: {e}"),
        Ok(_) => println!("no tenant -> sent (unexpected)"),
    }
    worker.stop().await;
    for report in reporter.reports.lock().unwrap().iter() {
        println!("reported: {report}");
    }
}
