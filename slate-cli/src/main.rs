//! The `slate` command.

fn main() {
    eprintln!("slate: under construction");
    std::process::exit(1);
}
