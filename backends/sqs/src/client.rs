//! The SDK clients: one HTTP/TLS stack (rustls with ring) shared by three configurations —
//! long-poll receives, ordinary calls, and heartbeats (one attempt each, short timeout).

use std::time::Duration;

use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_sqs::Client;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::config::SqsBrokerBuilder;
use crate::SqsError;

/// The clients of one broker.
#[derive(Clone, Debug)]
pub(crate) struct Clients {
    /// Long polls: attempts time out after the wait plus the call timeout.
    pub(crate) receive: Client,
    /// Sends, deletes, releases, attributes: standard retries.
    pub(crate) call: Client,
    /// Heartbeats: one attempt each, a short timeout, no share of the retry budget.
    pub(crate) beat: Client,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        // SQS closes idle connections after about 20 s: drop ours first, so a call never
        // lands on a socket the server is closing.
        .pool_idle_timeout(Duration::from_secs(15))
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

pub(crate) async fn build(settings: &SqsBrokerBuilder) -> Result<Clients, SqsError> {
    let http = http_client();
    let behavior = BehaviorVersion::v2026_01_12();
    let mut region = settings
        .region
        .clone()
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"));
    let endpoint = settings
        .endpoint
        .clone()
        .or_else(|| env("AWS_ENDPOINT_URL_SQS"))
        .or_else(|| env("AWS_ENDPOINT_URL"));

    let mut config = aws_sdk_sqs::Config::builder()
        .behavior_version(behavior)
        .http_client(http.clone());
    let keys = settings.keys.clone().or_else(|| {
        Some(crate::config::StaticKeys {
            access_key_id: env("AWS_ACCESS_KEY_ID")?,
            secret_access_key: env("AWS_SECRET_ACCESS_KEY")?,
            session_token: env("AWS_SESSION_TOKEN"),
        })
    });
    match keys {
        Some(k) => {
            config = config.credentials_provider(Credentials::new(
                k.access_key_id,
                k.secret_access_key,
                k.session_token,
                None,
                "ferriq-sqs",
            ));
        }
        None => {
            #[cfg(feature = "aws-config")]
            {
                let mut loader = aws_config::defaults(behavior).http_client(http.clone());
                if let Some(r) = &region {
                    loader = loader.region(Region::new(r.clone()));
                }
                let shared = loader.load().await;
                if region.is_none() {
                    region = shared.region().map(|r| r.to_string());
                }
                let provider = shared
                    .credentials_provider()
                    .ok_or(SqsError::NoCredentials)?;
                config = config.credentials_provider(provider);
            }
            #[cfg(not(feature = "aws-config"))]
            return Err(SqsError::NoCredentials);
        }
    }
    let region = region.take().ok_or(SqsError::NoRegion)?;
    config = config.region(Region::new(region));
    if let Some(e) = endpoint {
        config = config.endpoint_url(e);
    }
    let timeouts = |attempt: Duration| {
        TimeoutConfig::builder()
            .connect_timeout(settings.connect_timeout)
            .operation_attempt_timeout(attempt)
            .build()
    };
    let standard = RetryConfig::standard().with_max_attempts(3);
    let receive = config
        .clone()
        .timeout_config(timeouts(settings.wait_time + settings.call_timeout))
        .retry_config(standard.clone())
        .build();
    let call = config
        .clone()
        .timeout_config(timeouts(settings.call_timeout))
        .retry_config(standard)
        .build();
    let beat = config
        .timeout_config(timeouts(settings.heartbeat_timeout))
        .retry_config(RetryConfig::disabled())
        .build();
    Ok(Clients {
        receive: Client::from_conf(receive),
        call: Client::from_conf(call),
        beat: Client::from_conf(beat),
    })
}
