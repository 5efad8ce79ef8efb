// `system-alloc`: for heap profilers that hook malloc (Cargo.toml).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's option API (the `mimalloc` crate exposes no setter without extra features).
#[cfg(not(feature = "system-alloc"))]
unsafe extern "C" {
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

#[cfg(not(feature = "system-alloc"))]
/// `mi_option_purge_delay` in the pinned mimalloc (v3, libmimalloc-sys 0.1.49) and its
/// default in milliseconds.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;
#[cfg(not(feature = "system-alloc"))]
const MI_PURGE_DELAY_DEFAULT: std::ffi::c_long = 1000;

/// A simulation is a batch run that lives at its peak: memory mimalloc hands back to the OS
/// a second after it is freed is faulted in again (zeroed, in 2 MiB pages) moments later,
/// about 100,000 faults and a tenth of the fleet day's wall time. It keeps what it has
/// instead (peak RSS is the limit that counts). The controller keeps the default, so that
/// a long-running process gives memory back after a burst. Nothing is changed when the
/// option at that index does not hold the default this was written against (another
/// mimalloc version).
#[cfg(feature = "system-alloc")]
fn keep_freed_memory() {}

#[cfg(not(feature = "system-alloc"))]
fn keep_freed_memory() {
    // SAFETY: plain calls into the linked allocator's public option API (meant to be called
    // at run time); an index mimalloc does not know is ignored by it.
    unsafe {
        if mi_option_get(MI_OPTION_PURGE_DELAY) == MI_PURGE_DELAY_DEFAULT {
            mi_option_set(MI_OPTION_PURGE_DELAY, -1);
        }
    }
}

#[tokio::main]
async fn main() {
    let cli = kpssh::cli::parse();
    if matches!(cli.command, kpssh::cli::Command::Sim(_)) {
        keep_freed_memory();
    }
    let code = match kpssh::cli::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("kpssh: {err:#}");
            1
        }
    };
    std::process::exit(code);
}
