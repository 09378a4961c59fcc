//! A real PostgreSQL server for tests, from the machine's own server binaries (Debian's
//! `postgresql` package), started once per test binary on a free loopback port.
//!
//! `ONCEFLOW_TEST_POSTGRES=postgres://…` uses a server you run instead. Otherwise the
//! binaries are looked for under `/usr/lib/postgresql/<version>/bin` (the newest) or on the
//! `PATH`; a cluster is created in a temporary directory (`initdb`, trust authentication
//! on loopback only) and started; run as root, it runs as the `postgres` user, since the
//! server refuses root. A watchdog stops the server and removes its directory once the
//! test binary is gone, so nothing outlives the run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::{Error, Result};

/// A PostgreSQL server the tests can use.
#[derive(Debug)]
pub struct Postgres {
    url: String,
    /// How long it took to be ready (zero for a server given by the environment).
    pub started_in: Duration,
}

impl Postgres {
    /// `postgres://postgres@127.0.0.1:<port>/postgres`: the server's maintenance database;
    /// create a database of your own per test (`CREATE DATABASE …`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Creates a database of its own for a test, named `<prefix>_<unique>`, and returns its
    /// URL (feature `sqlx`, which brings the PostgreSQL client).
    #[cfg(feature = "sqlx")]
    pub async fn create_database(&self, prefix: &str) -> Result<String> {
        use sqlx::Connection;
        let name = super::unique_name(prefix).replace('-', "_");
        let mut admin = sqlx::PgConnection::connect(&self.url)
            .await
            .map_err(|e| Error::Environment(format!("PostgreSQL: {e}")))?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .map_err(|e| Error::Environment(format!("PostgreSQL: {e}")))?;
        let _ = admin.close().await;
        Ok(self.database_url(&name))
    }

    /// The URL of database `database` on the same server.
    pub fn database_url(&self, database: &str) -> String {
        match self.url.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{database}"),
            None => format!("{}/{database}", self.url),
        }
    }
}

static SHARED: OnceCell<std::result::Result<Postgres, String>> = OnceCell::const_new();

/// The PostgreSQL server shared by every test of this binary, started on first use.
///
/// # Panics
/// When no server can be started; the message says why.
pub async fn postgres() -> &'static Postgres {
    let started = SHARED
        .get_or_init(|| async {
            tokio::task::spawn_blocking(start)
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
        })
        .await;
    match started {
        Ok(postgres) => postgres,
        Err(why) => panic!("no PostgreSQL server for the tests: {why}"),
    }
}

fn start() -> Result<Postgres> {
    if let Ok(url) = std::env::var("ONCEFLOW_TEST_POSTGRES") {
        return Ok(Postgres {
            url,
            started_in: Duration::ZERO,
        });
    }
    let started = Instant::now();
    let bin = binaries()?;
    let root = std::env::temp_dir().join(super::unique_name("onceflow-postgres"));
    std::fs::create_dir_all(&root).map_err(|e| fail(format!("create {}: {e}", root.display())))?;
    let as_root = rustix::process::geteuid().is_root();
    if as_root {
        let (uid, gid) = postgres_user()?;
        std::os::unix::fs::chown(&root, Some(uid), Some(gid))
            .map_err(|e| fail(format!("chown {}: {e}", root.display())))?;
    }
    let data = root.join("data");
    let initdb = run_as(
        as_root,
        &bin.join("initdb"),
        &[
            "-D",
            &data.to_string_lossy(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ],
    )
    .output()
    .map_err(|e| fail(format!("initdb: {e}")))?;
    if !initdb.status.success() {
        return Err(fail(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr).trim()
        )));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| fail(format!("a free port: {e}")))?
        .port();
    // The server, and a watchdog that stops it when this process is gone.
    let script = r#"
        "$1" -D "$2" -p "$3" -k "$4" -c listen_addresses=127.0.0.1 -c fsync=off \
             -c max_connections=200 >"$4/server.log" 2>&1 &
        server=$!
        while [ -d "/proc/$5" ] && kill -0 "$server" 2>/dev/null; do sleep 1; done
        kill -INT "$server" 2>/dev/null
        wait "$server"
        rm -rf "$4"
    "#;
    let server = bin.join("postgres");
    let args = [
        "-c",
        script,
        "postgres-watchdog",
        &server.to_string_lossy(),
        &data.to_string_lossy(),
        &port.to_string(),
        &root.to_string_lossy(),
        &std::process::id().to_string(),
    ];
    run_as(as_root, Path::new("/bin/sh"), &args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| fail(format!("start postgres: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ready {
            break;
        }
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
            return Err(fail(format!(
                "the server did not become ready within 60 s; its log:\n{log}"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let started_in = started.elapsed();
    tracing::info!(port, ?started_in, "test PostgreSQL ready");
    Ok(Postgres {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        started_in,
    })
}

fn fail(message: String) -> Error {
    Error::Environment(format!("PostgreSQL: {message}"))
}

/// `program args`, as the `postgres` user when this process runs as root.
fn run_as(as_root: bool, program: &Path, args: &[&str]) -> Command {
    if as_root {
        let mut command = Command::new("runuser");
        command
            .args(["-u", "postgres", "--"])
            .arg(program)
            .args(args);
        command
    } else {
        let mut command = Command::new(program);
        command.args(args);
        command
    }
}

/// The directory of the server binaries: the newest `/usr/lib/postgresql/<v>/bin`, or
/// the one `initdb` on the `PATH` is in.
fn binaries() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists())
        .ok_or_else(|| {
            fail(
                "no server binaries (initdb, postgres): install Debian's `postgresql` package, \
                 or set ONCEFLOW_TEST_POSTGRES to a server's URL"
                    .into(),
            )
        })
}

/// The `postgres` user's uid and gid.
fn postgres_user() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let output = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| fail(format!("id: {e}")))?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                fail("running as root needs a `postgres` user (Debian's package creates it)".into())
            })
    };
    Ok((id("-u")?, id("-g")?))
}
