//! Test certificates, made afresh for every test binary: a CA, the broker's certificate
//! (for `localhost` and `127.0.0.1`), a client certificate the broker trusts, and one from
//! another CA that it must reject.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};

use crate::{Error, Result};

/// The common name of the trusted client certificate: the broker's principal for it is
/// `User:CN=onceflow-client`.
pub const CLIENT_COMMON_NAME: &str = "onceflow-client";

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertifiedKeyPem {
    /// The certificate (PEM).
    pub certificate: String,
    /// The unencrypted PKCS#8 private key (PEM): secret.
    pub private_key: String,
}

impl std::fmt::Debug for CertifiedKeyPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifiedKeyPem")
            .field("private_key", &"[redacted]")
            .finish_non_exhaustive()
    }
}

/// Everything TLS the secured test broker and its clients need.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA that signed the broker's and the trusted client's certificates (PEM).
    pub ca_certificate: String,
    /// The broker's certificate and key.
    pub broker: CertifiedKeyPem,
    /// A client certificate signed by the CA (`CN=onceflow-client`).
    pub client: CertifiedKeyPem,
    /// A client certificate with the same name, signed by a CA the broker does not trust.
    pub untrusted_client: CertifiedKeyPem,
}

fn rcgen_error(error: rcgen::Error) -> Error {
    Error::Environment(format!("generating test certificates: {error}"))
}

fn named(common_name: &str, names: &[&str]) -> Result<CertificateParams> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names).map_err(rcgen_error)?;
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, common_name);
    params.distinguished_name = subject;
    Ok(params)
}

fn certificate_authority(common_name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = named(common_name, &[])?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().map_err(rcgen_error)?;
    CertifiedIssuer::self_signed(params, key).map_err(rcgen_error)
}

fn leaf(
    common_name: &str,
    names: &[&str],
    issuer: &Issuer<'_, KeyPair>,
) -> Result<CertifiedKeyPem> {
    let key = KeyPair::generate().map_err(rcgen_error)?;
    let certificate = named(common_name, names)?
        .signed_by(&key, issuer)
        .map_err(rcgen_error)?;
    Ok(CertifiedKeyPem {
        certificate: certificate.pem(),
        private_key: key.serialize_pem(),
    })
}

impl TestPki {
    /// New keys and certificates.
    pub fn generate() -> Result<TestPki> {
        let ca = certificate_authority("onceflow test CA")?;
        let stranger = certificate_authority("some other CA")?;
        Ok(TestPki {
            ca_certificate: ca.pem(),
            broker: leaf("localhost", &["localhost", "127.0.0.1"], &ca)?,
            client: leaf(CLIENT_COMMON_NAME, &[], &ca)?,
            untrusted_client: leaf(CLIENT_COMMON_NAME, &[], &stranger)?,
        })
    }
}
