use tandem_fpga::kernels::{core_for, parse_params};
use tandem_fpga::shell::ShellConfig;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let core = core_for("router", &parse_params(&a[1]).unwrap()).unwrap();
    let e = tandem_fpga::emit::emit(core.as_ref(), ShellConfig { max_burst: 16 }, std::path::Path::new(&a[2])).unwrap();
    println!("{}", e.verilog.display());
}
