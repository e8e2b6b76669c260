//! TLS for the collector's own connections: ClickHouse over `https://` and PostgreSQL with an
//! `sslmode` (contract v4 §1, §3). rustls with the ring provider; the roots are a PEM file the
//! operator names (`COLLECTOR_CLICKHOUSE_CA_FILE`, PostgreSQL's `sslrootcert`) or else the
//! system's (`rustls-native-certs`: `/etc/ssl/certs` on Debian).
//!
//! Three ways to check the server, as libpq's `sslmode` names them: [`Verify::Full`] (the
//! chain to a root and the host name: `verify-full`, and every `https://` ClickHouse URL),
//! [`Verify::ChainOnly`] (the chain, not the name: `verify-ca`), [`Verify::Nothing`]
//! (encrypted, the certificate not checked: `require` and `prefer` without a root file, as
//! libpq does; the handshake's signatures are still checked).

pub mod libpq;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// How a server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Its chain to a root and the host name it was reached by.
    Full,
    /// Its chain to a root only.
    ChainOnly,
    /// Not at all (the connection is still encrypted).
    Nothing,
}

/// Why a TLS client configuration cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refuses the protocol versions asked for (a build without them).
    #[error("{0}")]
    Protocols(Error),
    /// The roots make no certificate verifier (none usable, say).
    #[error("{0}")]
    Verifier(rustls::client::VerifierBuilderError),
    /// The CA file cannot be read or is not PEM.
    #[error("{}: {source}", path.display())]
    CaFileRead {
        /// The file.
        path: PathBuf,
        /// What went wrong reading it.
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate of the CA file is not one rustls takes as a root.
    #[error("{}: {source}", path.display())]
    CaFileCertificate {
        /// The file.
        path: PathBuf,
        /// Why the certificate is refused.
        source: Error,
    },
    /// The CA file holds no certificate.
    #[error("{}: no PEM certificate in it", .0.display())]
    CaFileEmpty(PathBuf),
    /// No CA file named, and no root certificate of the system could be read.
    #[error("no root certificate of the system could be read ({0} errors); name a CA file")]
    NoSystemRoots(usize),
    /// A `sslmode` libpq does not know.
    #[error("sslmode={0}: must be disable, prefer, require, verify-ca or verify-full")]
    SslMode(String),
    /// The configuration for `sslrootcert` cannot be made.
    #[error("sslrootcert: {0}")]
    RootCert(Box<TlsError>),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration checking servers as `verify` says against the certificates of
/// `ca_file` (PEM), or the system's roots without one. Errors: the file cannot be read or
/// holds no certificate; no system root could be read.
pub fn client_config(
    ca_file: Option<&Path>,
    verify: Verify,
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Protocols)?;
    let config = match verify {
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCheck(provider())))
            .with_no_client_auth(),
        Verify::Full | Verify::ChainOnly => {
            let roots = Arc::new(roots(ca_file)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(TlsError::Verifier)?;
            if verify == Verify::Full {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                    .with_no_client_auth()
            }
        }
    };
    Ok(Arc::new(config))
}

/// The roots: every certificate of `ca_file`, or the system's.
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let read = |source| TlsError::CaFileRead {
                path: path.to_owned(),
                source,
            };
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(read)?
                .collect::<Result<_, _>>()
                .map_err(read)?;
            if certs.is_empty() {
                return Err(TlsError::CaFileEmpty(path.to_owned()));
            }
            for cert in certs {
                store
                    .add(cert)
                    .map_err(|source| TlsError::CaFileCertificate {
                        path: path.to_owned(),
                        source,
                    })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsError::NoSystemRoots(found.errors.len()));
            }
        }
    }
    Ok(store)
}

/// `verify-ca`: the chain must reach a root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` without a root file: any certificate, the handshake's signatures checked.
#[derive(Debug)]
struct NoCheck(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
