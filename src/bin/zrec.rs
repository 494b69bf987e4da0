//! `zrec`: the command line of [`zrecord::cli`] (inspect, verify, query, convert and demo
//! zrecord stores; run Ballista processes).

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(zrecord::cli::run(std::env::args_os()))
}
