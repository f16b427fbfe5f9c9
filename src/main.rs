use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = fencefs::cli::Cli::parse();
    std::process::exit(fencefs::app::run(cli.command));
}
