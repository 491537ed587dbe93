//! The harness's HTTP client: `GET` a path of a test process (a
//! `flightdeck-node`, Prometheus) over hyper, one connection per request,
//! and read the status and the whole body as text.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::redis::RedisServerError;

fn fail(addr: SocketAddr, e: impl std::fmt::Display) -> RedisServerError {
    RedisServerError::new(format!("http {addr}: {e}"))
}

/// `GET path` from `addr`: the status and the body (no timeout of its own:
/// bound it with `tokio::time::timeout`).
pub async fn get_async(addr: SocketAddr, path: &str) -> Result<(u16, String), RedisServerError> {
    let stream = TcpStream::connect(addr).await.map_err(|e| fail(addr, e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| fail(addr, e))?;
    // Drives the connection; ends when the reply is read and `sender` gone.
    let connection = tokio::spawn(connection);
    let request = Request::get(path)
        .header(HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(addr, e))?;
    let reply = sender
        .send_request(request)
        .await
        .map_err(|e| fail(addr, e))?;
    let status = reply.status().as_u16();
    let body = reply
        .into_body()
        .collect()
        .await
        .map_err(|e| fail(addr, e))?
        .to_bytes();
    drop(sender);
    let _ = connection.await;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`get_async`] for blocking code (on a runtime of its own), within
/// `limit`. Not from inside a tokio runtime: use [`get_async`] there.
pub fn get(
    addr: SocketAddr,
    path: &str,
    limit: Duration,
) -> Result<(u16, String), RedisServerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(addr, e))?;
    runtime.block_on(async {
        tokio::time::timeout(limit, get_async(addr, path))
            .await
            .map_err(|_| fail(addr, format!("GET {path}: no reply within {limit:?}")))?
    })
}
