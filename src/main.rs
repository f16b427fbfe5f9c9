use clap::Parser;

fn main() {
    // fuser's session warns "Failed to umount filesystem" on every clean unmount (its check
    // for a mount that is already gone never says gone); fencefs reports the real state.
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,fuser::session=error"),
    )
    .init();
    let cli = fencefs::cli::Cli::parse();
    std::process::exit(fencefs::app::run(cli.command));
}
