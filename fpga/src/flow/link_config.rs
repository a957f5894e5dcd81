//! The `v++ --link` configuration of one kernel on one platform: one compute unit (`nk=`)
//! and one memory bank per AXI master port (`sp=`), HBM pseudo-channels on a U55C, DDR banks
//! on a U250.

use std::fmt::Write as _;

use super::FlowError;
use crate::platform::Platform;
use crate::xclbin::KernelMeta;

/// The compute unit name of `kernel` in a link (`gemm_1`).
pub fn cu_name(kernel: &str) -> String {
    format!("{kernel}_1")
}

/// The banks of `kernel`'s memory ports on `platform`, in port order: port `i` gets bank
/// `i`. More ports than the platform has banks is an error.
pub fn port_banks(
    kernel: &KernelMeta,
    platform: &Platform,
) -> Result<Vec<(String, String)>, FlowError> {
    let ports: Vec<&str> = kernel.memory_ports().map(|p| p.name.as_str()).collect();
    if ports.is_empty() {
        return Err(FlowError::Config {
            msg: format!(
                "kernel `{}` has no AXI master port in its kernel.xml",
                kernel.name
            ),
        });
    }
    if ports.len() > platform.banks as usize {
        return Err(FlowError::Config {
            msg: format!(
                "kernel `{}` has {} memory ports, the {} has {} {} banks (one bank per port)",
                kernel.name,
                ports.len(),
                platform.board,
                platform.banks,
                platform.bank_prefix
            ),
        });
    }
    Ok(ports
        .iter()
        .zip(0u32..)
        .map(|(p, i)| ((*p).to_string(), platform.bank_name(i)))
        .collect())
}

/// The bank range of a kernel whose one memory port also reads a W stream striped over two
/// banks (an argument `w_odd`, [`crate::kernels::gemm::W_STRIPE_BYTES`]): `HBM[0:2]` on an
/// HBM platform, so the port reaches banks 0..=2 (the drivers' `w_stripe_banks`); `None`
/// otherwise (one bank per port).
pub fn striped_w_range(kernel: &KernelMeta, platform: &Platform) -> Option<String> {
    let one_port = kernel.memory_ports().count() == 1;
    let takes = kernel.args.iter().any(|a| a.name == "w_odd");
    (one_port && takes && platform.bank_prefix == "HBM" && platform.banks >= 3)
        .then(|| format!("{}[0:2]", platform.bank_prefix))
}

/// The text of the link configuration file (`--config link.cfg`).
pub fn link_config(kernel: &KernelMeta, platform: &Platform) -> Result<String, FlowError> {
    let banks = port_banks(kernel, platform)?;
    let k = &kernel.name;
    let cu = cu_name(k);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# v++ link configuration of `{k}` for the {} ({}), written by `tandem fpga package`.",
        platform.board, platform.vbnv
    );
    let _ = writeln!(
        s,
        "# One compute unit; each AXI master port on its own {} bank.",
        platform.bank_prefix
    );
    let _ = writeln!(s, "[connectivity]");
    let _ = writeln!(s, "nk={k}:1:{cu}");
    let striped = striped_w_range(kernel, platform);
    for (port, bank) in &banks {
        match &striped {
            Some(range) => {
                let _ = writeln!(
                    s,
                    "# {port} reaches three pseudo-channels through the HBM switch: the \
                     drivers put x, y and the parameters in the first, W's stripes in the \
                     other two."
                );
                let _ = writeln!(s, "sp={cu}.{port}:{range}");
            }
            None => {
                let _ = writeln!(s, "sp={cu}.{port}:{bank}");
            }
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "[vivado]");
    let _ = writeln!(s, "prop=run.impl_1.STEPS.OPT_DESIGN.ARGS.DIRECTIVE=Explore");
    let _ = writeln!(
        s,
        "prop=run.impl_1.STEPS.ROUTE_DESIGN.ARGS.DIRECTIVE=Explore"
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{U55C, U250};
    use crate::xclbin::PortMeta;

    fn kernel(ports: &[&str]) -> KernelMeta {
        let mut p = vec![PortMeta {
            name: "s_axi_control".into(),
            mode: "slave".into(),
            data_width: Some(32),
        }];
        p.extend(ports.iter().map(|n| PortMeta {
            name: (*n).into(),
            mode: "master".into(),
            data_width: Some(64),
        }));
        KernelMeta {
            name: "gemm".into(),
            language: Some("ip_c".into()),
            vlnv: None,
            control_protocol: Some("ap_ctrl_hs".into()),
            ports: p,
            args: Vec::new(),
        }
    }

    #[test]
    fn u55c_maps_each_port_to_its_own_hbm_channel() {
        let cfg = link_config(&kernel(&["m_axi_gmem0", "m_axi_gmem1"]), &U55C).expect("cfg");
        assert_eq!(
            cfg,
            "# v++ link configuration of `gemm` for the Alveo U55C (xilinx_u55c_gen3x16_xdma_3_202210_1), written by `tandem fpga package`.\n\
             # One compute unit; each AXI master port on its own HBM bank.\n\
             [connectivity]\n\
             nk=gemm:1:gemm_1\n\
             sp=gemm_1.m_axi_gmem0:HBM[0]\n\
             sp=gemm_1.m_axi_gmem1:HBM[1]\n\
             \n\
             [vivado]\n\
             prop=run.impl_1.STEPS.OPT_DESIGN.ARGS.DIRECTIVE=Explore\n\
             prop=run.impl_1.STEPS.ROUTE_DESIGN.ARGS.DIRECTIVE=Explore\n"
        );
    }

    #[test]
    fn a_striped_w_port_reaches_three_hbm_channels() {
        use crate::xclbin::ArgMeta;
        let mut k = kernel(&["m_axi_gmem"]);
        assert!(
            link_config(&k, &U55C)
                .expect("cfg")
                .contains("\nsp=gemm_1.m_axi_gmem:HBM[0]\n")
        );
        k.args.push(ArgMeta {
            name: "w_odd".into(),
            id: 10,
            address_qualifier: 1,
            port: "m_axi_gmem".into(),
            size: 8,
            offset: 0x60,
            c_type: "char*".into(),
        });
        let cfg = link_config(&k, &U55C).expect("cfg");
        assert!(cfg.contains("\nsp=gemm_1.m_axi_gmem:HBM[0:2]\n"), "{cfg}");
        // DDR banks: one per port, striped or not
        let cfg = link_config(&k, &U250).expect("cfg");
        assert!(cfg.contains("\nsp=gemm_1.m_axi_gmem:DDR[0]\n"), "{cfg}");
    }

    #[test]
    fn u250_uses_ddr_banks_and_refuses_a_fifth_port() {
        let cfg = link_config(&kernel(&["m_axi_gmem"]), &U250).expect("cfg");
        assert!(cfg.contains("\nsp=gemm_1.m_axi_gmem:DDR[0]\n"), "{cfg}");
        assert!(!cfg.contains("HBM"));
        let e = link_config(&kernel(&["a", "b", "c", "d", "e"]), &U250)
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "kernel `gemm` has 5 memory ports, the Alveo U250 has 4 DDR banks (one bank per port)"
            )
        );
        assert!(link_config(&kernel(&[]), &U55C).is_err());
    }

    #[test]
    fn the_card_gemm_binds_each_master_to_its_own_pseudo_channel() {
        use crate::core::KernelCore;
        let core = crate::kernels::gemm::GemmCore::u55c_wide();
        let xml = core
            .desc()
            .kernel_xml(core.data_bits())
            .expect("kernel.xml");
        let ks = crate::xclbin::metadata::parse_kernels(xml.as_bytes()).expect("parse");
        let cfg = link_config(&ks[0], &U55C).expect("cfg");
        for line in [
            "\nsp=gemm_1.m_axi_gmem:HBM[0]\n",
            "\nsp=gemm_1.m_axi_gmem1:HBM[1]\n",
            "\nsp=gemm_1.m_axi_gmem2:HBM[2]\n",
        ] {
            assert!(cfg.contains(line), "{line}: {cfg}");
        }
        assert!(!cfg.contains("HBM[0:2]"), "{cfg}");
        assert!(
            ks[0]
                .ports
                .iter()
                .all(|p| p.mode != "master" || p.data_width == Some(512)),
            "{xml}"
        );
    }
}
