mod sim;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() > 1 && args[1] == "sim" {
        if let Err(e) = sim::main(&args[2..]) {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
