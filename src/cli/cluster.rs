//! `zrec ballista scheduler|executor`: a Ballista cluster process.

use super::*;

/// Ballista's log lines on stderr, at the level `ZREC_LOG` names (error, warn, info, debug,
/// trace; default warn).
pub(super) struct StderrLog(log::LevelFilter);

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.0
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("{} {} {}", r.level(), r.target(), r.args());
        }
    }

    fn flush(&self) {}
}

pub(super) fn ballista(role: BallistaRole) -> Result<()> {
    use crate::query::ballista::{run_executor, run_scheduler, ExecutorOptions, SchedulerOptions};
    let level = std::env::var("ZREC_LOG").ok().and_then(|l| l.parse::<log::LevelFilter>().ok()).unwrap_or(log::LevelFilter::Warn);
    if log::set_logger(Box::leak(Box::new(StderrLog(level)))).is_ok() {
        log::set_max_level(level);
    }
    let rt = crate::io::runtime::build("zrec", None, Some(32 << 20))?;
    rt.block_on(async {
        match role {
            BallistaRole::Scheduler { bind, external_host } => {
                eprintln!("zrec ballista scheduler listening on {bind}");
                run_scheduler(SchedulerOptions { bind, external_host }).await
            }
            BallistaRole::Executor { scheduler, bind_host, external_host, port, grpc_port, concurrent_tasks, work_dir } => {
                eprintln!("zrec ballista executor on {bind_host}:{port} (gRPC {grpc_port}) for scheduler {scheduler}");
                run_executor(ExecutorOptions { bind_host, external_host, port, grpc_port, scheduler, concurrent_tasks, work_dir }).await
            }
        }
    })
}
