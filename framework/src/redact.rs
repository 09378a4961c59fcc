//! Which configuration values are secret, and what is shown in their place.
//!
//! Every place that prints a Kafka property (`verify-config`, `Debug` of the configuration
//! types, errors that echo a property) asks [`is_secret`] first. The list errs on the side
//! of hiding: any key that mentions a password or a secret, and every property that holds
//! key material inline.

/// What is printed instead of a secret value.
pub(crate) const REDACTED: &str = "[redacted]";

/// Properties holding key material or credentials whose names say neither "password" nor
/// "secret" (librdkafka's CONFIGURATION.md marks them sensitive).
const SECRET_KEYS: &[&str] = &[
    "ssl.key.pem",
    "ssl_key",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// Whether the value of the Kafka property `key` must never be printed.
pub(crate) fn is_secret(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.contains("jaas")
        || SECRET_KEYS.contains(&key.as_str())
}

/// `value`, or [`REDACTED`] when `key` is secret.
pub(crate) fn shown<'a>(key: &str, value: &'a str) -> &'a str {
    if is_secret(key) { REDACTED } else { value }
}

/// `Debug` of Kafka properties with the secret values redacted.
pub(crate) struct Properties<'a>(pub(crate) &'a [(String, String)]);

impl std::fmt::Debug for Properties<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(key, value)| (key, shown(key, value))))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_keys_and_secrets_are_hidden_and_paths_are_not() {
        for key in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "SSL.KEY.PEM",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
        ] {
            assert!(is_secret(key), "{key}");
        }
        for key in [
            "sasl.username",
            "ssl.key.location",
            "ssl.ca.location",
            "ssl.certificate.pem",
            "security.protocol",
        ] {
            assert!(!is_secret(key), "{key}");
        }
        let debug = format!(
            "{:?}",
            Properties(&[
                ("sasl.username".into(), "alice".into()),
                ("sasl.password".into(), "hunter2".into())
            ])
        );
        assert_eq!(
            debug,
            r#"[("sasl.username", "alice"), ("sasl.password", "[redacted]")]"#
        );
    }
}
