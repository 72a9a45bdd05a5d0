//! TLS settings: a private certificate authority to trust, and a client certificate to present
//! (mTLS). Certificates and host names are always verified; there is no switch to turn that
//! off.

use std::path::PathBuf;

use crate::ValkeyError;

/// The TLS files a store connects with: read when it connects.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    /// PEM certificates to trust instead of the system's roots.
    pub(crate) ca: Option<PathBuf>,
    /// The client certificate chain (PEM) and its private key (PEM).
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

impl std::fmt::Debug for TlsFiles {
    // Paths only: never a key's content.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca)
            .field("client_cert", &self.identity.as_ref().map(|(c, _)| c))
            .finish_non_exhaustive()
    }
}

impl TlsFiles {
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.identity.is_some()
    }
}

/// What to tell the user about a TLS failure, from the client's error text: which setting to
/// fix. `None` when it is not a TLS failure.
pub(crate) fn explain(reason: &str) -> Option<&'static str> {
    let r = reason.to_ascii_lowercase();
    let hint = if r.contains("unknownissuer") || r.contains("unknown issuer") {
        "the server's certificate is not signed by a CA this client trusts: set FERRIQ_STORE_TLS_CA (builder: tls_ca_file) to the PEM file of the CA that signed it"
    } else if r.contains("notvalidforname") || r.contains("not valid for name") {
        "the server's certificate is not for the host name in the URL: connect with a name the certificate lists (its subjectAltName), or have the certificate reissued"
    } else if r.contains("expired") {
        "the server's certificate has expired: have it renewed"
    } else if r.contains("notvalidyet") {
        "the server's certificate is not valid yet: check the server's and this machine's clocks"
    } else if r.contains("certificaterequired")
        || r.contains("certificate required")
        || r.contains("badcertificate")
        || r.contains("unknownca")
        || r.contains("bad certificate")
    {
        "the server refused this client's certificate (or wants one): set FERRIQ_STORE_TLS_CERT and FERRIQ_STORE_TLS_KEY (builder: tls_client_cert) to a certificate signed by a CA the server trusts"
    } else if r.contains("corrupt message")
        || r.contains("invalidcontenttype")
        || r.contains("invalid content type")
        || r.contains("wrong version number")
        || r.contains("invalidmessage")
    {
        "the server does not speak TLS on this port: use redis:// (or valkey://) for a plain port, or the server's TLS port"
    } else if r.contains("tls") || r.contains("certificate") {
        "a TLS failure: check FERRIQ_STORE_TLS_CA, FERRIQ_STORE_TLS_CERT and FERRIQ_STORE_TLS_KEY"
    } else {
        return None;
    };
    Some(hint)
}

#[cfg(feature = "tls")]
fn setting_error(
    setting: &str,
    path: &std::path::Path,
    what: impl std::fmt::Display,
) -> ValkeyError {
    ValkeyError::Setting(format!("{setting} ({}): {what}", path.display()))
}

/// The connector for these files (`None`: none set, fred's default — the system's roots).
#[cfg(feature = "tls")]
pub(crate) fn connector(
    files: &TlsFiles,
) -> Result<Option<fred::types::config::TlsConnector>, ValkeyError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use std::sync::Arc;

    if !files.is_set() {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    match &files.ca {
        Some(path) => {
            let read = |e: rustls_pki_types::pem::Error| {
                setting_error(
                    "FERRIQ_STORE_TLS_CA",
                    path,
                    format!("not a readable PEM certificate file ({e})"),
                )
            };
            for cert in CertificateDer::pem_file_iter(path).map_err(read)? {
                roots
                    .add(cert.map_err(read)?)
                    .map_err(|e| setting_error("FERRIQ_STORE_TLS_CA", path, e))?;
            }
            if roots.is_empty() {
                return Err(setting_error(
                    "FERRIQ_STORE_TLS_CA",
                    path,
                    "holds no certificate",
                ));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ValkeyError::Setting(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let certs = CertificateDer::pem_file_iter(cert_path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    setting_error(
                        "FERRIQ_STORE_TLS_CERT",
                        cert_path,
                        format!("not a readable PEM certificate file ({e})"),
                    )
                })?;
            if certs.is_empty() {
                return Err(setting_error(
                    "FERRIQ_STORE_TLS_CERT",
                    cert_path,
                    "holds no certificate",
                ));
            }
            // The key's own parse error could quote it: only its file is named.
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|_| {
                setting_error(
                    "FERRIQ_STORE_TLS_KEY",
                    key_path,
                    "not a readable PEM private key (PKCS#8, PKCS#1 or SEC1)",
                )
            })?;
            builder.with_client_auth_cert(certs, key).map_err(|_| {
                setting_error(
                    "FERRIQ_STORE_TLS_KEY",
                    key_path,
                    "does not match the client certificate",
                )
            })?
        }
    };
    Ok(Some(fred::types::config::TlsConnector::from(config)))
}

/// Without the `tls` feature: TLS files are a mistake to report, not to ignore.
#[cfg(not(feature = "tls"))]
pub(crate) fn refuse_without_feature(files: &TlsFiles) -> Result<(), ValkeyError> {
    if files.is_set() {
        return Err(ValkeyError::Setting(
            "TLS files are set but this build has no TLS: enable the `tls` feature of ferriq-valkey"
                .into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tls_failure_names_what_to_fix() {
        for (reason, word) in [
            (
                "invalid peer certificate: UnknownIssuer",
                "FERRIQ_STORE_TLS_CA",
            ),
            ("invalid peer certificate: NotValidForName", "host name"),
            ("invalid peer certificate: Expired", "expired"),
            (
                "received fatal alert: CertificateRequired",
                "FERRIQ_STORE_TLS_CERT",
            ),
            (
                "received corrupt message of type InvalidContentType",
                "does not speak TLS",
            ),
        ] {
            let hint = explain(reason).unwrap_or_default();
            assert!(hint.contains(word), "{reason}: {hint}");
        }
        assert!(explain("Connection refused").is_none());
    }

    #[test]
    fn debug_names_the_files_only() {
        let files = TlsFiles {
            ca: Some("/etc/ca.pem".into()),
            identity: Some(("/etc/client.pem".into(), "/etc/secret-key.pem".into())),
        };
        let shown = format!("{files:?}");
        assert!(
            shown.contains("ca.pem") && !shown.contains("secret-key"),
            "{shown}"
        );
    }
}
