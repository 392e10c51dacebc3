//! What is measured: the cases, the setups, and the addresses and ports they use.

pub(crate) const ECHO: u16 = 7001;
pub(crate) const SINK: u16 = 7002;
pub(crate) const SOURCE: u16 = 7003;
/// HTTP/1.1: `GET /` answered with [`HTTP_BODY`] (hyper on tokio or corelane, or nginx).
pub(crate) const HTTP: u16 = 8080;
pub(crate) const HTTP_BODY: &str = "hello from the compare server\n";
pub(crate) const KERNEL_SERVER: &str = "10.77.0.1";
pub(crate) const KERNEL_CLIENT: &str = "10.77.0.2";
pub(crate) const CORELANE_SERVER: &str = "10.77.0.3";
pub(crate) const CORELANE_CLIENT: &str = "10.77.0.4";
pub(crate) const CHUNK: usize = 64 * 1024;
pub(crate) const CONNECT_CONNS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Rr {
        size: usize,
        conns: usize,
    },
    BulkIn,
    BulkOut,
    Connect,
    /// HTTP/1.1 keep-alive `GET /` from wrk with `conns` connections.
    Http {
        conns: usize,
    },
}

impl Kind {
    pub(crate) fn name(self) -> String {
        match self {
            Kind::Rr { size, conns } => format!("rr {size} B x {conns} conn"),
            Kind::BulkIn => "bulk in (client to server)".into(),
            Kind::BulkOut => "bulk out (server to client)".into(),
            Kind::Connect => format!("connect ({CONNECT_CONNS} at a time)"),
            Kind::Http { conns } => format!("http GET (wrk) x {conns} conn"),
        }
    }

    pub(crate) fn id(self) -> String {
        match self {
            Kind::Rr { size, conns } => format!("rr{size}_c{conns}"),
            Kind::BulkIn => "bulk_in".into(),
            Kind::BulkOut => "bulk_out".into(),
            Kind::Connect => "connect".into(),
            Kind::Http { conns } => format!("http_c{conns}"),
        }
    }

    pub(crate) fn bulk(self) -> bool {
        matches!(self, Kind::BulkIn | Kind::BulkOut)
    }

    /// Whether `setup` takes part in this case: HTTP is served by the kernel and corelane
    /// servers (hyper) and nginx, with wrk (a kernel client) as the load; nginx serves nothing
    /// else.
    pub(crate) fn runs_on(self, setup: Setup) -> bool {
        match self {
            Kind::Http { .. } => {
                matches!(setup, Setup::Kernel | Setup::CorelaneServer | Setup::Nginx)
            }
            _ => setup != Setup::Nginx,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setup {
    Kernel,
    CorelaneServer,
    CorelaneBoth,
    CorelaneClient,
    /// The kernel-socket load generator against the C epoll server.
    Epoll,
    /// The kernel-socket load generator against a monoio (io_uring, thread-per-core) server.
    Monoio,
    /// Debian's nginx, for the HTTP case only.
    Nginx,
}

impl Setup {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Setup::Kernel => "kernel",
            Setup::CorelaneServer => "corelane-server",
            Setup::CorelaneBoth => "corelane-both",
            Setup::CorelaneClient => "corelane-client",
            Setup::Epoll => "epoll-c",
            Setup::Monoio => "monoio",
            Setup::Nginx => "nginx",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<Setup, String> {
        match s {
            "kernel" => Ok(Setup::Kernel),
            "corelane-server" => Ok(Setup::CorelaneServer),
            "corelane-both" => Ok(Setup::CorelaneBoth),
            "corelane-client" => Ok(Setup::CorelaneClient),
            "epoll-c" => Ok(Setup::Epoll),
            "monoio" => Ok(Setup::Monoio),
            "nginx" => Ok(Setup::Nginx),
            o => Err(format!(
                "--setups: `{o}` is not kernel, corelane-server, corelane-both, corelane-client, \
                 epoll-c, monoio or nginx"
            )),
        }
    }

    pub(crate) fn corelane_server(self) -> bool {
        matches!(self, Setup::CorelaneServer | Setup::CorelaneBoth)
    }

    pub(crate) fn corelane_client(self) -> bool {
        matches!(self, Setup::CorelaneClient | Setup::CorelaneBoth)
    }
}
