//! The settings, checked without a server: the URLs, the stream name, the
//! ranges, and the credential and certificate files, read and parsed.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::{ConnectOptions, ServerAddr};

use super::{Credentials, Plan};
use crate::sinks::nats::{CreateStream, NatsAuth, NatsError, NatsSinkBuilder, SubjectTemplate};

impl Plan {
    pub(in crate::sinks::nats) fn new(b: &NatsSinkBuilder) -> Result<Plan, NatsError> {
        if b.servers.is_empty() {
            return Err(NatsError::NoServers);
        }
        let mut servers = Vec::with_capacity(b.servers.len());
        for url in &b.servers {
            servers.push(server_addr(url)?);
        }
        let shown = servers
            .iter()
            .map(|s| format!("{}://{}:{}", s.scheme(), s.host(), s.port()))
            .collect::<Vec<_>>()
            .join(",");
        check_stream_name(&b.stream)?;
        let template = SubjectTemplate::parse(&b.subject)?;
        let positive = |field, d: Duration| {
            if d.is_zero() || d > Duration::from_secs(3600) {
                Err(NatsError::Setting {
                    field,
                    reason: format!("{d:?} is out of range; allowed: 1ms to 1h"),
                })
            } else {
                Ok(d)
            }
        };
        let ack_timeout = positive("ack_timeout", b.ack_timeout)?;
        let connect_timeout = positive("connect_timeout", b.connect_timeout)?;
        if let Some(c) = &b.create_stream {
            check_create(c)?;
        }
        if let Some(path) = &b.tls_ca_file {
            let pem = read_file("tls_ca_file", "CA certificate file", path)?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(NatsError::File {
                    field: "tls_ca_file",
                    what: "CA certificate file",
                    path: path.clone(),
                    reason: "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
                });
            }
        }
        let credentials = credentials(&b.auth)?;
        Ok(Plan {
            servers,
            shown,
            stream: b.stream.clone(),
            template,
            credentials,
            auth_field: b.auth.field(),
            tls_ca_file: b.tls_ca_file.clone(),
            require_tls: b.require_tls,
            ack_timeout,
            connect_timeout,
            create_stream: b.create_stream.clone(),
        })
    }
}

fn server_addr(url: &str) -> Result<ServerAddr, NatsError> {
    let fail = |reason: String| NatsError::Server {
        url: url.split('@').next_back().unwrap_or(url).to_string(),
        reason,
    };
    if !url.contains("://") {
        return Err(fail(
            "is not a URL; write nats://host:port or tls://host:port".into(),
        ));
    }
    let addr: ServerAddr = url
        .parse()
        .map_err(|e: std::io::Error| fail(e.to_string()))?;
    if !matches!(addr.scheme(), "nats" | "tls") {
        return Err(fail(format!(
            "scheme {}:// is not supported; use nats:// or tls://",
            addr.scheme()
        )));
    }
    if addr.has_user_pass() || addr.username().is_some() {
        return Err(fail(
            "holds credentials; give them with user + password, a token, a creds file or an \
             NKey seed file, never in the URL"
                .into(),
        ));
    }
    if addr.host().is_empty() {
        return Err(fail("has no host".into()));
    }
    Ok(addr)
}

fn check_stream_name(name: &str) -> Result<(), NatsError> {
    let fail = |reason| {
        Err(NatsError::StreamName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return fail("it is empty");
    }
    if name.len() > 255 {
        return fail("it is longer than 255 bytes");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return fail("it holds whitespace, a control character, or one of . * > / \\");
    }
    Ok(())
}

fn check_create(c: &CreateStream) -> Result<(), NatsError> {
    let bad = |field, reason: String| Err(NatsError::Setting { field, reason });
    if !(1..=5).contains(&c.replicas) {
        return bad(
            "create_stream.replicas",
            format!("{} is out of range; allowed: 1 to 5", c.replicas),
        );
    }
    if c.duplicate_window.is_zero() {
        return bad(
            "create_stream.duplicate_window",
            "must be longer than zero, such as 2m".into(),
        );
    }
    if !c.max_age.is_zero() && c.duplicate_window > c.max_age {
        return bad(
            "create_stream.duplicate_window",
            format!(
                "{:?} is longer than create_stream.max_age ({:?}); JetStream cannot remember \
                 an id longer than it keeps the message",
                c.duplicate_window, c.max_age
            ),
        );
    }
    Ok(())
}

fn read_file(field: &'static str, what: &'static str, path: &PathBuf) -> Result<String, NatsError> {
    std::fs::read_to_string(path).map_err(|e| NatsError::File {
        field,
        what,
        path: path.clone(),
        reason: e.to_string(),
    })
}

fn credentials(auth: &NatsAuth) -> Result<Credentials, NatsError> {
    let empty = |field, what: &str| NatsError::Credential {
        field,
        reason: format!("the {what} is empty"),
    };
    Ok(match auth {
        NatsAuth::None => Credentials::None,
        NatsAuth::Token(t) if t.trim().is_empty() => return Err(empty("token", "token")),
        NatsAuth::Token(t) => Credentials::Token(t.trim().to_string()),
        NatsAuth::UserPassword { user, .. } if user.is_empty() => {
            return Err(empty("user", "user name"))
        }
        NatsAuth::UserPassword { password, .. } if password.is_empty() => {
            return Err(empty("password", "password"))
        }
        NatsAuth::UserPassword { user, password } => {
            Credentials::UserPassword(user.clone(), password.clone())
        }
        NatsAuth::CredsFile(path) => {
            let text = read_file("creds_file", "credentials file", path)?;
            ConnectOptions::with_credentials(&text).map_err(|e| NatsError::File {
                field: "creds_file",
                what: "credentials file",
                path: path.clone(),
                reason: format!("{e} (expected a user JWT and NKey seed, as `nsc` writes them)"),
            })?;
            Credentials::Creds(text)
        }
        NatsAuth::NkeySeedFile(path) => {
            let seed = read_file("nkey_seed_file", "NKey seed file", path)?
                .trim()
                .to_string();
            nkeys::KeyPair::from_seed(&seed).map_err(|e| NatsError::File {
                field: "nkey_seed_file",
                what: "NKey seed file",
                path: path.clone(),
                reason: format!("it holds no valid NKey seed (SU…): {e}"),
            })?;
            Credentials::Nkey(seed)
        }
    })
}
