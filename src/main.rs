#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = kpssh::cli::parse();
    let code = match kpssh::cli::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kpssh: {err:#}");
            1
        }
    };
    std::process::exit(code);
}
