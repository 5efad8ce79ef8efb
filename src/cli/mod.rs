//! The `kpssh` command line: one module per subcommand.

pub mod probe;
