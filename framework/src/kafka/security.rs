//! Authentication and authorization failures, told apart from the rest and explained.
//!
//! ```text
//!  start ─► check_connection: metadata, 1 s at a time, while a watching context hears
//!           librdkafka's error and log events ─► SASL/SSL failure? ─► Error::Authentication
//!  later ─► any *_AUTHORIZATION_FAILED code is fatal (kafka_error), and on the way out
//!           explain() names the ACL and the principal ─► Error::Unauthorized
//! ```
//!
//! librdkafka does not fail a request when the broker rejects its credentials: it
//! reconnects with backoff for ever and reports the failure as an error event on the
//! client's main queue, which only a client that is polled ever sees. Hence the check at
//! start with a polled client, so a wrong password stops the instance in about a second
//! instead of after a metadata timeout (or never).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};

use super::{ClientOptions, kafka_error};
use crate::blocking::blocking;
use crate::{Error, Result};

/// A client context that keeps the first authentication or TLS failure librdkafka reports.
#[derive(Default)]
struct Watch {
    failure: Mutex<Option<String>>,
}

impl Watch {
    fn record(&self, what: &str) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        failure.get_or_insert_with(|| what.to_owned());
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Whether a librdkafka log line or error reason says the credentials were refused.
fn is_credentials_failure(text: &str) -> bool {
    [
        "SASL authentication error",
        "SASL authentication failed",
        "Authentication failed",
        "SSL handshake failed",
        "certificate verify failed",
        // TLS alerts from a broker that refused the client certificate (under TLS 1.3 they
        // arrive after the handshake, on the first read).
        "alert certificate",
        "alert unknown ca",
        "alert bad certificate",
        "alert handshake failure",
        "alert access denied",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

impl ClientContext for Watch {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        if is_credentials_failure(log_message) {
            self.record(log_message);
        }
        DefaultClientContext.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let refused = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::Authentication
                    | RDKafkaErrorCode::SaslAuthenticationFailed
                    | RDKafkaErrorCode::SSL
            )
        );
        if refused || is_credentials_failure(reason) {
            self.record(reason);
        }
        DefaultClientContext.error(error, reason);
    }
}

impl ProducerContext for Watch {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// Connects and reads the cluster's metadata, to fail fast and clearly when the
/// credentials are refused (wrong password, unknown user, untrusted certificate).
pub(crate) async fn check_connection(options: &ClientOptions, timeout: Duration) -> Result<()> {
    let producer: BaseProducer<Watch> =
        options
            .config(&[])
            .create_with_context(Watch::default())
            .map_err(|e| kafka_error("create the connection check client", e))?;
    let principal = options.principal();
    let bootstrap = options.bootstrap_servers.clone();
    blocking("connect to the cluster", move || {
        let deadline = Instant::now() + timeout;
        loop {
            let attempt = producer
                .client()
                .fetch_metadata(None, Duration::from_secs(1));
            // Serves the main queue, where librdkafka puts error and log events.
            producer.poll(Duration::ZERO);
            if let Some(detail) = producer.context().failure() {
                return Err(Error::Authentication { principal, detail });
            }
            match attempt {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    return Err(kafka_error(format!("connect to {bootstrap}"), error));
                }
                Err(_) => {}
            }
        }
    })
    .await
}

/// The names an authorization failure may be about.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resources {
    pub(crate) group: String,
    pub(crate) transactional_id: Option<String>,
    pub(crate) input: String,
    /// Every topic the instance writes: outputs, changelog, dead letters.
    pub(crate) writes: Vec<String>,
}

/// Turns a Kafka error with an authorization code into [`Error::Unauthorized`], naming
/// the ACL the principal lacks; any other error is returned as it is.
pub(crate) fn explain(error: Error, options: &ClientOptions, names: &Resources) -> Error {
    let Error::Kafka {
        operation,
        code,
        message,
        ..
    } = &error
    else {
        return error;
    };
    use crate::Operation as Op;
    use RDKafkaErrorCode as C;
    let Some(code) = super::error::rd_code(*code) else {
        return error;
    };
    let acl = match code {
        C::TopicAuthorizationFailed => match operation {
            Op::Produce { topic } => format!("WRITE on topic `{topic}`"),
            Op::CreateTopic { topic } => format!("CREATE on topic `{topic}` (or on the cluster)"),
            Op::Consume { .. } => format!("READ on topic `{}`", names.input),
            other => match other.topic() {
                Some(topic) => format!("DESCRIBE (and READ or WRITE) on topic `{topic}`"),
                // Adding partitions to a transaction is refused for all of them at once:
                // the broker does not say which topic it was.
                None => format!(
                    "WRITE on topic {} (one of the topics its transactions write; the broker \
                     does not say which)",
                    names
                        .writes
                        .iter()
                        .map(|t| format!("`{t}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        },
        C::GroupAuthorizationFailed => format!("READ on group `{}`", names.group),
        C::TransactionalIdAuthorizationFailed => format!(
            "WRITE on transactional ID `{}`",
            names.transactional_id.as_deref().unwrap_or("?")
        ),
        C::ClusterAuthorizationFailed => {
            "IDEMPOTENT_WRITE on the cluster (or WRITE on a topic it writes)".to_owned()
        }
        _ => return error,
    };
    Error::Unauthorized {
        principal: options.principal(),
        acl,
        operation: operation.clone(),
        detail: format!("{message} ({code})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    fn denied(operation: crate::Operation, code: RDKafkaErrorCode) -> Error {
        Error::Kafka {
            operation,
            code: crate::kafka::error::code_of(code),
            message: "Broker: authorization failed".into(),
            class: ErrorClass::Fatal,
            cause: None,
        }
    }

    fn names() -> Resources {
        Resources {
            group: "billing".into(),
            transactional_id: Some("billing-a".into()),
            input: "orders".into(),
            writes: vec!["invoices".into(), "billing-txlog".into()],
        }
    }

    #[test]
    fn each_denial_names_the_acl_and_the_principal() {
        let options = ClientOptions::with_properties(
            "b:9092",
            &[
                ("security.protocol".into(), "SASL_SSL".into()),
                ("sasl.username".into(), "alice".into()),
                ("sasl.password".into(), "hunter2".into()),
            ],
        );
        let cases = [
            (
                crate::Operation::produce("invoices"),
                RDKafkaErrorCode::TopicAuthorizationFailed,
                "WRITE on topic `invoices`",
            ),
            (
                crate::Operation::Consume {
                    topic: "orders".into(),
                },
                RDKafkaErrorCode::TopicAuthorizationFailed,
                "READ on topic `orders`",
            ),
            (
                "commit_transaction".into(),
                RDKafkaErrorCode::TopicAuthorizationFailed,
                "`invoices`, `billing-txlog`",
            ),
            (
                "init_transactions".into(),
                RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
                "WRITE on transactional ID `billing-a`",
            ),
            (
                "poll".into(),
                RDKafkaErrorCode::GroupAuthorizationFailed,
                "READ on group `billing`",
            ),
            (
                "init_transactions".into(),
                RDKafkaErrorCode::ClusterAuthorizationFailed,
                "IDEMPOTENT_WRITE on the cluster",
            ),
        ];
        for (operation, code, acl) in cases {
            let error = explain(denied(operation, code), &options, &names());
            let text = error.to_string();
            assert!(matches!(error, Error::Unauthorized { .. }), "{text}");
            assert!(error.is_fatal() && !error.is_retriable(), "{text}");
            assert!(text.contains(acl), "{text}");
            assert!(text.contains("User:alice"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
        let other = explain(
            denied("poll".into(), RDKafkaErrorCode::NotCoordinator),
            &options,
            &names(),
        );
        assert!(matches!(other, Error::Kafka { .. }));
    }

    #[test]
    fn the_principal_follows_the_security_protocol() {
        let mtls = ClientOptions::with_properties(
            "b:9092",
            &[
                ("security.protocol".into(), "SSL".into()),
                ("ssl.certificate.location".into(), "/etc/client.pem".into()),
            ],
        );
        assert!(mtls.principal().contains("/etc/client.pem"));
        assert_eq!(
            ClientOptions::with_properties("b:9092", &[]).principal(),
            "User:ANONYMOUS"
        );
    }

    #[test]
    fn refused_credentials_are_recognised_in_librdkafka_text() {
        assert!(is_credentials_failure(
            "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed \
             during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
        ));
        assert!(is_credentials_failure(
            "ssl://127.0.0.1:1/bootstrap: SSL handshake failed: ssl/record/rec_layer_s3.c:1605: \
             error:0A000418:SSL routines::tlsv1 alert unknown ca"
        ));
        assert!(is_credentials_failure(
            "ssl://127.0.0.1:1/bootstrap: Receive failed: error:0A00045C:SSL routines::tlsv13 \
             alert certificate required: SSL alert number 116"
        ));
        assert!(!is_credentials_failure("Connection refused"));
    }
}
