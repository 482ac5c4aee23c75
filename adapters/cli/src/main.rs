//! The `syncopate` command line. See `syncopate --help`.

fn main() -> std::process::ExitCode {
    syncopate_adapters::cli::main()
}
