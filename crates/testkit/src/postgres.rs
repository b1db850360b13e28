//! The test PostgreSQL server that `.ci/start-postgres` runs: fresh databases on it, and
//! restarting it mid-test.

/// A fresh database on the test PostgreSQL server `TOOLGRID_TEST_POSTGRES_URL` names
/// (`.ci/start-postgres` prints one); `None` when it names none, which fails the test
/// under `CI=true` (see [`require`](crate::require)) and skips it otherwise.
pub async fn fresh_test_database() -> Option<String> {
    let admin = std::env::var("TOOLGRID_TEST_POSTGRES_URL")
        .ok()
        .filter(|url| !url.is_empty());
    if !crate::require(
        "PostgreSQL (TOOLGRID_TEST_POSTGRES_URL, from .ci/start-postgres)",
        admin.is_some(),
    ) {
        return None;
    }
    Some(fresh_postgres(&admin?).await)
}

/// A fresh database on the test PostgreSQL server named by `admin`.
pub async fn fresh_postgres(admin: &str) -> String {
    use sqlx::Connection;
    let name = format!("toolgrid_{}", uuid::Uuid::now_v7().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .expect("connect to PostgreSQL");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create database");
    let base = admin
        .rsplit_once('/')
        .map(|(base, _)| base)
        .unwrap_or(admin);
    format!("{base}/{name}")
}

/// Restarts the test PostgreSQL server (`.ci/start-postgres`'s: PGDATA=/tmp/toolgrid-postgres,
/// run as the postgres user). `None` when this machine cannot (not root, no server there).
pub fn restart_postgres() -> Option<Result<(), String>> {
    const PGDATA: &str = "/tmp/toolgrid-postgres";
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .max()
        .map(|(_, bin)| bin)?;
    if !root || !std::path::Path::new(PGDATA).join("postmaster.pid").exists() {
        return None;
    }
    let command = format!(
        "{}/pg_ctl -D {PGDATA} -m fast -w -l {PGDATA}.log restart",
        bin.display()
    );
    let status = std::process::Command::new("su")
        .args(["postgres", "-s", "/bin/sh", "-c", &command])
        .stdout(std::process::Stdio::null())
        .status();
    Some(match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("{command}: {status}")),
        Err(error) => Err(format!("{command}: {error}")),
    })
}
