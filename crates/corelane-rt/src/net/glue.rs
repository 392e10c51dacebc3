//! What hyper-util's client and tonic's server ask of a connection, for corelane's: with the
//! `hyper` feature a connector for hyper-util's pooled `Client` (and what builds on it), with
//! the `tonic` feature the connection information and the stream of accepted connections that
//! `tonic::transport::Server::serve_with_incoming` takes.

#[cfg(feature = "hyper")]
pub use connector::Connector;
#[cfg(feature = "tonic")]
pub use incoming::{ConnectInfo, Incoming};

#[cfg(feature = "hyper")]
mod connector {
    use std::future::Future;
    use std::io;
    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper_util::client::legacy::connect::{Connected, Connection};
    use hyper_util::rt::TokioIo;

    use crate::net::TcpStream;

    /// hyper-util's `Connect` for its pooled client: a corelane connection from the calling
    /// task's core to the `Uri`'s address (`http://10.0.0.2:8080/`; names are not resolved).
    /// Build one client per core, so that each core's pool holds that core's connections (a
    /// client shared by the cores works too, through each connection's own core).
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # async fn f() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use hyper_util::client::legacy::Client;
    /// use hyper_util::rt::TokioExecutor;
    /// // Inside a task of Runtime::run:
    /// let client: Client<_, http_body_util::Empty<bytes::Bytes>> =
    ///     Client::builder(TokioExecutor::new()).build(corelane::net::Connector::new());
    /// let res = client.get("http://10.0.0.2:8080/".parse()?).await?;
    /// println!("{}", res.status());
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Connector {
        _private: (),
    }

    impl Connector {
        /// A connector.
        pub fn new() -> Connector {
            Connector::default()
        }
    }

    impl Connection for TcpStream {
        fn connected(&self) -> Connected {
            Connected::new()
        }
    }

    /// Where a `Uri` leads: its host must be an address (a name is refused: corelane resolves
    /// none); its port, or 80.
    fn target(uri: &hyper::Uri) -> io::Result<SocketAddr> {
        let host = uri.host().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip: std::net::IpAddr = host.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{uri}: the host `{host}` is not an address; corelane resolves no names \
                     (resolve it first, or connect by address)"
                ),
            )
        })?;
        if uri.scheme_str().is_some_and(|s| s != "http") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri}: only http is spoken here (wrap the stream in TLS for https)"),
            ));
        }
        Ok(SocketAddr::new(ip, uri.port_u16().unwrap_or(80)))
    }

    impl tower_service::Service<hyper::Uri> for Connector {
        type Response = TokioIo<TcpStream>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, uri: hyper::Uri) -> Self::Future {
            let to = target(&uri);
            Box::pin(async move { Ok(TokioIo::new(TcpStream::connect(to?).await?)) })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_uri_leads_to_its_address_and_a_name_is_refused_in_words() {
            let t = |s: &str| match s.parse() {
                Ok(u) => target(&u),
                Err(e) => panic!("{s}: {e}"),
            };
            assert_eq!(
                t("http://10.0.0.2:8080/x").ok(),
                "10.0.0.2:8080".parse().ok()
            );
            assert_eq!(t("http://10.0.0.2/").ok(), "10.0.0.2:80".parse().ok());
            assert_eq!(t("http://[fd00::2]:81/").ok(), "[fd00::2]:81".parse().ok());
            let e = t("http://example.com/").expect_err("a name");
            assert!(e.to_string().contains("resolves no names"), "{e}");
            let e = t("https://10.0.0.2/").expect_err("tls");
            assert!(e.to_string().contains("only http"), "{e}");
        }
    }
}

#[cfg(feature = "tonic")]
mod incoming {
    use std::io;
    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use crate::net::{TcpListener, TcpStream};

    /// The addresses of a connection, as tonic hands them to a service
    /// (`request.extensions().get::<ConnectInfo>()`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ConnectInfo {
        /// This end.
        pub local: Option<SocketAddr>,
        /// The peer.
        pub remote: Option<SocketAddr>,
    }

    impl tonic::transport::server::Connected for TcpStream {
        type ConnectInfo = ConnectInfo;

        fn connect_info(&self) -> ConnectInfo {
            ConnectInfo {
                local: self.local_addr().ok(),
                remote: self.peer_addr().ok(),
            }
        }
    }

    /// A listener's accepted connections as a stream, for
    /// `tonic::transport::Server::serve_with_incoming`.
    ///
    /// ```no_run
    /// # use corelane_rt as corelane;
    /// # use tonic::codegen::{Service, http};
    /// # async fn f<S>(svc: S) -> Result<(), Box<dyn std::error::Error>>
    /// # where S: Service<http::Request<tonic::body::Body>,
    /// #     Response = http::Response<tonic::body::Body>, Error = std::convert::Infallible>
    /// #     + tonic::server::NamedService + Clone + Send + Sync + 'static, S::Future: Send + 'static {
    /// // Inside a core's future of Runtime::run, with `svc` a service tonic-build made:
    /// let listener = corelane::net::TcpListener::bind(50051).await?;
    /// tonic::transport::Server::builder()
    ///     .add_service(svc)
    ///     .serve_with_incoming(corelane::net::Incoming::new(listener))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[derive(Debug)]
    pub struct Incoming {
        listener: TcpListener,
    }

    impl Incoming {
        /// The connections `listener` accepts.
        pub fn new(listener: TcpListener) -> Incoming {
            Incoming { listener }
        }
    }

    impl tokio_stream::Stream for Incoming {
        type Item = io::Result<TcpStream>;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.listener
                .poll_accept(cx)
                .map(|r| Some(r.map(|(s, _)| s)))
        }
    }
}
