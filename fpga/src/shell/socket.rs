//! The socket the shell plugs a kernel core into: a rust-hdl black box with the core
//! contract's ports ([`crate::core`]) whose Verilog is the core's own.

use rust_hdl::prelude::*;

/// A kernel core seen from the shell, with `W`-bit data ports (`S = W / 8` strobes).
#[derive(LogicBlock)]
pub struct CoreSocket<const W: usize, const S: usize> {
    /// Core port `clock`.
    pub clock: Signal<In, Clock>,
    /// Core port `reset`.
    pub reset: Signal<In, Bit>,
    /// Core port `start`.
    pub start: Signal<In, Bit>,
    /// Core port `done`.
    pub done: Signal<Out, Bit>,
    /// Core port `busy`.
    pub busy: Signal<Out, Bit>,
    /// Core port `arg0`.
    pub arg0: Signal<In, Bits<32>>,
    /// Core port `arg1`.
    pub arg1: Signal<In, Bits<32>>,
    /// Core port `arg2`.
    pub arg2: Signal<In, Bits<32>>,
    /// Core port `arg3`.
    pub arg3: Signal<In, Bits<32>>,
    /// Core port `arg4`.
    pub arg4: Signal<In, Bits<32>>,
    /// Core port `arg5`.
    pub arg5: Signal<In, Bits<32>>,
    /// Core port `arg6`.
    pub arg6: Signal<In, Bits<32>>,
    /// Core port `arg7`.
    pub arg7: Signal<In, Bits<32>>,
    /// Core port `ptr0`.
    pub ptr0: Signal<In, Bits<64>>,
    /// Core port `ptr1`.
    pub ptr1: Signal<In, Bits<64>>,
    /// Core port `ptr2`.
    pub ptr2: Signal<In, Bits<64>>,
    /// Core port `ptr3`.
    pub ptr3: Signal<In, Bits<64>>,
    /// Core port `ptr4`.
    pub ptr4: Signal<In, Bits<64>>,
    /// Core port `ptr5`.
    pub ptr5: Signal<In, Bits<64>>,
    /// Core port `ptr6`.
    pub ptr6: Signal<In, Bits<64>>,
    /// Core port `ptr7`.
    pub ptr7: Signal<In, Bits<64>>,
    /// Core port `rd_req_valid`.
    pub rd_req_valid: Signal<Out, Bit>,
    /// Core port `rd_req_ready`.
    pub rd_req_ready: Signal<In, Bit>,
    /// Core port `rd_req_addr`.
    pub rd_req_addr: Signal<Out, Bits<64>>,
    /// Core port `rd_req_len`.
    pub rd_req_len: Signal<Out, Bits<32>>,
    /// Core port `rd_data_valid`.
    pub rd_data_valid: Signal<In, Bit>,
    /// Core port `rd_data_ready`.
    pub rd_data_ready: Signal<Out, Bit>,
    /// Core port `rd_data`.
    pub rd_data: Signal<In, Bits<W>>,
    /// Core port `wr_req_valid`.
    pub wr_req_valid: Signal<Out, Bit>,
    /// Core port `wr_req_ready`.
    pub wr_req_ready: Signal<In, Bit>,
    /// Core port `wr_req_addr`.
    pub wr_req_addr: Signal<Out, Bits<64>>,
    /// Core port `wr_req_len`.
    pub wr_req_len: Signal<Out, Bits<32>>,
    /// Core port `wr_data_valid`.
    pub wr_data_valid: Signal<Out, Bit>,
    /// Core port `wr_data_ready`.
    pub wr_data_ready: Signal<In, Bit>,
    /// Core port `wr_data`.
    pub wr_data: Signal<Out, Bits<W>>,
    /// Core port `wr_strb`.
    pub wr_strb: Signal<Out, Bits<S>>,
    _module: String,
    _code: String,
}

impl<const W: usize, const S: usize> CoreSocket<W, S> {
    /// A socket for the module `module` whose Verilog is `code`.
    pub fn new(module: &str, code: String) -> Self {
        Self {
            clock: Default::default(),
            reset: Default::default(),
            start: Default::default(),
            done: Default::default(),
            busy: Default::default(),
            arg0: Default::default(),
            arg1: Default::default(),
            arg2: Default::default(),
            arg3: Default::default(),
            arg4: Default::default(),
            arg5: Default::default(),
            arg6: Default::default(),
            arg7: Default::default(),
            ptr0: Default::default(),
            ptr1: Default::default(),
            ptr2: Default::default(),
            ptr3: Default::default(),
            ptr4: Default::default(),
            ptr5: Default::default(),
            ptr6: Default::default(),
            ptr7: Default::default(),
            rd_req_valid: Default::default(),
            rd_req_ready: Default::default(),
            rd_req_addr: Default::default(),
            rd_req_len: Default::default(),
            rd_data_valid: Default::default(),
            rd_data_ready: Default::default(),
            rd_data: Default::default(),
            wr_req_valid: Default::default(),
            wr_req_ready: Default::default(),
            wr_req_addr: Default::default(),
            wr_req_len: Default::default(),
            wr_data_valid: Default::default(),
            wr_data_ready: Default::default(),
            wr_data: Default::default(),
            wr_strb: Default::default(),
            _module: module.to_string(),
            _code: code,
        }
    }
}

impl<const W: usize, const S: usize> Logic for CoreSocket<W, S> {
    fn update(&mut self) {}

    fn connect(&mut self) {
        self.done.connect();
        self.busy.connect();
        self.rd_req_valid.connect();
        self.rd_req_addr.connect();
        self.rd_req_len.connect();
        self.rd_data_ready.connect();
        self.wr_req_valid.connect();
        self.wr_req_addr.connect();
        self.wr_req_len.connect();
        self.wr_data_valid.connect();
        self.wr_data.connect();
        self.wr_strb.connect();
    }

    fn hdl(&self) -> Verilog {
        Verilog::Blackbox(BlackBox {
            code: self._code.clone(),
            name: self._module.clone(),
        })
    }
}
