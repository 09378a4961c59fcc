//! The outside world of the effect tests: a payment service over real HTTP on loopback
//! that counts every charge it applies, and the [`Effect`] that calls it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use onceflow::effects::{Checked, Effect, Intent, Outcome};

/// How the payment service behaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// A second charge under a key already charged is not applied again (the answer
    /// is the first one's). `false`: every POST charges, as a system without
    /// idempotency keys does.
    pub honours_keys: bool,
    /// Keys whose first POST is applied but answered 503: the caller cannot tell.
    pub ambiguous_once: BTreeSet<String>,
    /// Keys never charged: every POST answers 503, every check too.
    pub never: BTreeSet<String>,
}

/// What the payment service saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Charges applied, by idempotency key (more than 1: charged twice).
    pub applied: BTreeMap<String, u32>,
    /// POSTs received, by key.
    pub requests: BTreeMap<String, u32>,
    /// Checks (GETs) received, by key.
    pub checks: BTreeMap<String, u32>,
}

#[derive(Debug, Default)]
struct Shared {
    behaviour: Behaviour,
    seen: Seen,
}

/// A running payment service; stopped when dropped.
#[derive(Debug)]
pub struct PaymentService {
    /// `http://127.0.0.1:port`.
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PaymentService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl PaymentService {
    /// Starts one on a free loopback port.
    pub async fn start(behaviour: Behaviour) -> PaymentService {
        let shared = Arc::new(Mutex::new(Shared {
            behaviour,
            seen: Seen::default(),
        }));
        let app = Router::new()
            .route("/charges", post(charge))
            .route("/charges/{key}", get(check))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("payment service");
        });
        PaymentService {
            url,
            shared,
            server,
        }
    }

    /// Runs `read` on what it saw so far.
    pub fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
        read(&self.shared.lock().expect("shared").seen)
    }
}

async fn charge(
    State(shared): State<Arc<Mutex<Shared>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return (StatusCode::BAD_REQUEST, "no Idempotency-Key".into());
    };
    let mut shared = shared.lock().expect("shared");
    let first = !shared.seen.requests.contains_key(&key);
    *shared.seen.requests.entry(key.clone()).or_default() += 1;
    if shared.behaviour.never.contains(&key) {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later".into());
    }
    let charged = shared.seen.applied.get(&key).copied().unwrap_or(0);
    if !(shared.behaviour.honours_keys && charged > 0) {
        *shared.seen.applied.entry(key.clone()).or_default() += 1;
    }
    let answer = format!("{{\"charge\":\"ch-{key}\",\"bytes\":{}}}", body.len());
    if first && shared.behaviour.ambiguous_once.contains(&key) {
        // Applied, but the caller is told nothing it can trust.
        return (StatusCode::SERVICE_UNAVAILABLE, "gateway timeout".into());
    }
    (StatusCode::OK, answer)
}

async fn check(
    State(shared): State<Arc<Mutex<Shared>>>,
    Path(key): Path<String>,
) -> (StatusCode, String) {
    let mut shared = shared.lock().expect("shared");
    *shared.seen.checks.entry(key.clone()).or_default() += 1;
    if shared.behaviour.never.contains(&key) {
        return (StatusCode::SERVICE_UNAVAILABLE, "cannot tell".into());
    }
    if shared.seen.applied.contains_key(&key) {
        (StatusCode::OK, format!("{{\"charge\":\"ch-{key}\"}}"))
    } else {
        (StatusCode::NOT_FOUND, "no such charge".into())
    }
}

/// Charges through the payment service: POST `/charges` with the intent's idempotency
/// key in `Idempotency-Key`; with `checks_back`, GET `/charges/{key}` tells whether a
/// charge happened.
#[derive(Debug, Clone)]
pub struct HttpCharge {
    url: String,
    checks_back: bool,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl HttpCharge {
    /// Charges through the service at `url`.
    pub fn new(url: impl Into<String>, checks_back: bool) -> Self {
        HttpCharge {
            url: url.into(),
            checks_back,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<(u16, serde_json::Value), String> {
        let call = self.client.request(request);
        let response = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .map_err(|_| "no answer within 5 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((
            status,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        ))
    }
}

#[onceflow::async_trait]
impl Effect for HttpCharge {
    fn name(&self) -> &str {
        "http-charge"
    }

    fn checks_back(&self) -> bool {
        self.checks_back
    }

    async fn apply(&mut self, intent: &Intent) -> Outcome {
        let request = hyper::Request::post(format!("{}/charges", self.url))
            .header("idempotency-key", &intent.idempotency_key)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(intent.payload.to_string())))
            .expect("request");
        match self.call(request).await {
            Ok((200..=299, body)) => Outcome::Applied(Some(body)),
            Ok((status @ 400..=499, _)) => Outcome::Refused(format!("HTTP {status}")),
            Ok((status, _)) => Outcome::Ambiguous(format!("HTTP {status}")),
            Err(error) => Outcome::Ambiguous(error),
        }
    }

    async fn check(&mut self, intent: &Intent) -> Checked {
        // The key holds `/`: percent-encoded into one path segment.
        let segment: String = intent
            .idempotency_key
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let request = hyper::Request::get(format!("{}/charges/{segment}", self.url))
            .body(Full::new(Bytes::new()))
            .expect("request");
        match self.call(request).await {
            Ok((200, body)) => Checked::Done(Some(body)),
            Ok((404, _)) => Checked::NotDone,
            Ok((status, _)) => Checked::Unknown(format!("HTTP {status}")),
            Err(error) => Checked::Unknown(error),
        }
    }
}
