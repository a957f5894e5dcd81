// 4-state testbench of an emitted tandem kernel (Icarus Verilog), driven by
// tandem_sim::icarus::IcarusCard over stdin/stdout, one command per line.
//
// The kernel is any emitted top module (`KERNEL`, a macro: router, gemm, attention): the Vitis
// ports `ap_clk`, `ap_rst_n`, `s_axi_control_*` (AXI4-Lite, 12-bit addresses, 32-bit data),
// `m_axi_gmem_*` (AXI4, 64-bit addresses, `DW`-bit data: a macro, 64 unless defined, one of
// 64, 128, 256, 512), `interrupt`.
//
// What it does:
// - plays the host on `s_axi_control` (register writes and reads, one at a time, with the AW
//   and W channels raised together and the responses awaited);
// - serves `m_axi_gmem` from a memory of `MEM_WORDS` 64-bit words at byte address `BASE`,
//   with random stalls on every channel (`+stall=P`: each ready/valid decision of the
//   memory stalls with probability P%, seed `+seed=N`): AR and AW are queued, R beats come
//   in request order with `rlast`, W beats are written by `wstrb`, one B per burst; a beat is
//   `DW`/64 consecutive words (word i of the beat in bits 64i+63:64i, so byte b of the beat
//   is byte b of memory from the beat's address on, `wstrb[b]` its strobe);
// - checks the AXI rules every cycle after reset: no X on a valid or ready, no X on a
//   payload while its valid is high (W: `wdata`, `wstrb`, `wlast`), a stalled valid stays
//   high with its payload unchanged (all `DW` bits of `wdata`, all `DW`/8 of `wstrb`), AR/AW
//   bursts are INCR of `DW`/8-byte beats (`arsize`, `awsize` = log2(`DW`/8)) at addresses
//   aligned to the beat that stay within one 4 KiB page and inside the memory, `wlast`
//   exactly on the last beat of each burst, no W beat before its burst's AW; each breach
//   prints a line `VIOLATION <cycle> <what>` (the first 50; all are counted);
// - memory that was never written stays X, so a kernel that reads what it never loaded, or
//   leaves part of an output unwritten, shows X in what the host reads back.
//
// Commands (stdin: `<letter> <hex a> <hex b>`; every answer starts with `OK` or `ERR`):
//   W off val   write register `off`                              -> OK
//   R off 0     read register `off` (for AP_CTRL the clear-on-read bits a `C` saw first) -> OK <hex>
//   L w n       $readmemh("in.hex") into words w .. w+n-1          -> OK
//   D w n       $writememh("out.hex") of words w .. w+n-1          -> OK
//   C n 0       run at most n cycles, polling AP_CTRL back to back until ap_done
//               -> OK <1 if done> <cycles run> <cycles of the last run, ap_start write to done>
//   V 0 0       -> OK <violations so far> <cycle>
//   Q 0 0       end the simulation
//
// The read channels of `m_axi_gmem` are served by the `rd_slave` module below. With `MULTI`
// defined (a kernel with the read-only masters `m_axi_gmem1`, `m_axi_gmem2`), each of those is
// served from the same memory by an `rd_slave` of its own, with the same stalls and the same
// checks as `m_axi_gmem`'s read channels.
`timescale 1ns/1ps
`ifndef KERNEL
`define KERNEL router
`endif
`ifndef MEM_WORDS
`define MEM_WORDS 131072
`endif
`ifndef DW
`define DW 64
`endif

module axi_tb;
    localparam [63:0] BASE = 64'h0000_0004_0000_0000;
    localparam integer MEM_WORDS = `MEM_WORDS;
    localparam [31:0] STDIN = 32'h8000_0000;
    localparam [31:0] STDOUT = 32'h8000_0001;
    localparam integer AXIL_WAIT = 1000; // cycles a register access may take
    localparam integer QD = 64;          // depth of the AR / AW queues
    localparam integer DW = `DW;         // data bits of a beat
    localparam integer NB = DW / 8;      // bytes of a beat (`wstrb` bits)
    localparam integer NW = DW / 64;     // memory words of a beat
    localparam [2:0] LG = $clog2(NB);    // log2 of NB: the AXI beat size
    initial if (DW != 64 && DW != 128 && DW != 256 && DW != 512) begin
        $fdisplay(32'h8000_0002, "axi_tb: DW = %0d is not 64, 128, 256 or 512", DW);
        $finish;
    end

    reg ap_clk = 1'b0;
    reg ap_rst_n = 1'b0;
    always #5 ap_clk = ~ap_clk;

    // ---- AXI4-Lite (host side) ----
    reg s_awvalid = 1'b0, s_wvalid = 1'b0, s_bready = 1'b0, s_arvalid = 1'b0, s_rready = 1'b0;
    reg [11:0] s_awaddr = 12'd0, s_araddr = 12'd0;
    reg [31:0] s_wdata = 32'd0;
    reg [3:0] s_wstrb = 4'd0;
    wire s_awready, s_wready, s_bvalid, s_arready, s_rvalid;
    wire [1:0] s_bresp, s_rresp;
    wire [31:0] s_rdata;

    // ---- AXI4 master (memory side) ----
    wire m_awvalid, m_wvalid, m_bready, m_arvalid, m_rready, m_wlast;
    wire [63:0] m_awaddr, m_araddr;
    wire [DW-1:0] m_wdata;
    wire [NB-1:0] m_wstrb;
    wire [7:0] m_awlen, m_arlen;
    wire [2:0] m_awsize, m_arsize;
    wire [1:0] m_awburst, m_arburst;
    reg m_awready = 1'b0, m_wready = 1'b0, m_bvalid = 1'b0;
    reg [1:0] m_bresp = 2'd0;
    wire m_arready, m_rvalid, m_rlast;  // driven by the read slave gmem0
    wire [DW-1:0] m_rdata;
    wire [1:0] m_rresp;
    wire irq;
`ifdef MULTI
    // ---- the read-only masters m_axi_gmem1 and m_axi_gmem2 ----
    wire x1_arvalid, x1_rready, x2_arvalid, x2_rready;
    wire [63:0] x1_araddr, x2_araddr;
    wire [DW-1:0] x1_rdata, x2_rdata;
    wire [7:0] x1_arlen, x2_arlen;
    wire [2:0] x1_arsize, x2_arsize;
    wire [1:0] x1_arburst, x2_arburst, x1_rresp, x2_rresp;
    wire x1_arready, x1_rvalid, x1_rlast, x2_arready, x2_rvalid, x2_rlast;
`endif

    `KERNEL dut (
        .ap_clk(ap_clk), .ap_rst_n(ap_rst_n),
        .s_axi_control_awvalid(s_awvalid), .s_axi_control_awready(s_awready),
        .s_axi_control_awaddr(s_awaddr),
        .s_axi_control_wvalid(s_wvalid), .s_axi_control_wready(s_wready),
        .s_axi_control_wdata(s_wdata), .s_axi_control_wstrb(s_wstrb),
        .s_axi_control_bvalid(s_bvalid), .s_axi_control_bready(s_bready),
        .s_axi_control_bresp(s_bresp),
        .s_axi_control_arvalid(s_arvalid), .s_axi_control_arready(s_arready),
        .s_axi_control_araddr(s_araddr),
        .s_axi_control_rvalid(s_rvalid), .s_axi_control_rready(s_rready),
        .s_axi_control_rdata(s_rdata), .s_axi_control_rresp(s_rresp),
        .m_axi_gmem_awvalid(m_awvalid), .m_axi_gmem_awready(m_awready),
        .m_axi_gmem_awaddr(m_awaddr), .m_axi_gmem_awlen(m_awlen),
        .m_axi_gmem_awsize(m_awsize), .m_axi_gmem_awburst(m_awburst),
        .m_axi_gmem_wvalid(m_wvalid), .m_axi_gmem_wready(m_wready),
        .m_axi_gmem_wdata(m_wdata), .m_axi_gmem_wstrb(m_wstrb), .m_axi_gmem_wlast(m_wlast),
        .m_axi_gmem_bvalid(m_bvalid), .m_axi_gmem_bready(m_bready),
        .m_axi_gmem_bresp(m_bresp),
        .m_axi_gmem_arvalid(m_arvalid), .m_axi_gmem_arready(m_arready),
        .m_axi_gmem_araddr(m_araddr), .m_axi_gmem_arlen(m_arlen),
        .m_axi_gmem_arsize(m_arsize), .m_axi_gmem_arburst(m_arburst),
        .m_axi_gmem_rvalid(m_rvalid), .m_axi_gmem_rready(m_rready),
        .m_axi_gmem_rdata(m_rdata), .m_axi_gmem_rlast(m_rlast), .m_axi_gmem_rresp(m_rresp),
`ifdef MULTI
        .m_axi_gmem1_arvalid(x1_arvalid), .m_axi_gmem1_arready(x1_arready),
        .m_axi_gmem1_araddr(x1_araddr), .m_axi_gmem1_arlen(x1_arlen),
        .m_axi_gmem1_arsize(x1_arsize), .m_axi_gmem1_arburst(x1_arburst),
        .m_axi_gmem1_rvalid(x1_rvalid), .m_axi_gmem1_rready(x1_rready),
        .m_axi_gmem1_rdata(x1_rdata), .m_axi_gmem1_rlast(x1_rlast), .m_axi_gmem1_rresp(x1_rresp),
        .m_axi_gmem2_arvalid(x2_arvalid), .m_axi_gmem2_arready(x2_arready),
        .m_axi_gmem2_araddr(x2_araddr), .m_axi_gmem2_arlen(x2_arlen),
        .m_axi_gmem2_arsize(x2_arsize), .m_axi_gmem2_arburst(x2_arburst),
        .m_axi_gmem2_rvalid(x2_rvalid), .m_axi_gmem2_rready(x2_rready),
        .m_axi_gmem2_rdata(x2_rdata), .m_axi_gmem2_rlast(x2_rlast), .m_axi_gmem2_rresp(x2_rresp),
`endif
        .interrupt(irq)
    );

`ifdef MULTI
    // the slaves of the read-only masters m_axi_gmem1 and m_axi_gmem2
    rd_slave #(.DW(DW)) gmem1 (
        .clk(ap_clk), .rst_n(ap_rst_n),
        .arvalid(x1_arvalid), .arready(x1_arready), .araddr(x1_araddr), .arlen(x1_arlen),
        .arsize(x1_arsize), .arburst(x1_arburst),
        .rvalid(x1_rvalid), .rready(x1_rready), .rdata(x1_rdata), .rlast(x1_rlast), .rresp(x1_rresp)
    );
    rd_slave #(.DW(DW)) gmem2 (
        .clk(ap_clk), .rst_n(ap_rst_n),
        .arvalid(x2_arvalid), .arready(x2_arready), .araddr(x2_araddr), .arlen(x2_arlen),
        .arsize(x2_arsize), .arburst(x2_arburst),
        .rvalid(x2_rvalid), .rready(x2_rready), .rdata(x2_rdata), .rlast(x2_rlast), .rresp(x2_rresp)
    );
`endif

    // ---- state ----
    reg [63:0] mem [0:MEM_WORDS-1];
    reg [63:0] cycle = 64'd0;
    reg checking = 1'b0;
    integer seed = 1;
    integer stall = 0;
    integer violations = 0;
    always @(posedge ap_clk) cycle <= cycle + 64'd1;

    // automatic: several always blocks may report in the same time step, and a static task's
    // argument is one variable shared by all callers (Icarus then prints the last caller's
    // text for every call)
    task automatic violation(input [8*96-1:0] what);
        begin
            violations = violations + 1;
            if (violations <= 50) begin
                $fdisplay(STDOUT, "VIOLATION %0d %0s", cycle, what);
                $fflush(STDOUT);
            end
        end
    endtask

    function go; // 1 unless this decision stalls
        input dummy;
        begin
            go = (stall <= 0) || ((($random(seed) & 32'h7fffffff) % 100) >= stall);
        end
    endfunction

    function in_mem; // whether a burst of n beats (NB bytes each) at byte address a is in memory
        input [63:0] a;
        input [8:0] n;
        begin
            in_mem = (a >= BASE)
                && (((a - BASE) >> 3) + {55'd0, n} * NW <= MEM_WORDS);
        end
    endfunction

    function burst_ok; // INCR, NB-byte beats, aligned to the beat, within one 4 KiB page
        input [63:0] a;
        input [7:0] len;
        input [2:0] size;
        input [1:0] burst;
        begin
            burst_ok = (burst == 2'b01) && (size == LG) && (a[5:0] & (NB - 1)) == 0
                && ({52'd0, a[11:0]} + ({56'd0, len} + 64'd1) * NB <= 64'd4096);
        end
    endfunction

    // ---- rule checks on what the kernel drives (sampled before each rising edge) ----
    reg ar_held = 1'b0, aw_held = 1'b0, w_held = 1'b0;
    reg [63:0] ar_a, aw_a;
    reg [DW-1:0] w_d;
    reg [NB-1:0] w_s;
    reg [7:0] ar_l, aw_l;
    reg w_l;
    always @(posedge ap_clk) if (checking) begin
        if (^{m_awvalid, m_wvalid, m_bready, m_arvalid, m_rready, irq} === 1'bx)
            violation("X on an m_axi_gmem valid/ready or on interrupt");
        if (^{s_awready, s_wready, s_bvalid, s_arready, s_rvalid} === 1'bx)
            violation("X on an s_axi_control valid/ready");
        if (m_arvalid === 1'b1 && ^{m_araddr, m_arlen, m_arsize, m_arburst} === 1'bx)
            violation("X on the AR payload while arvalid");
        if (m_awvalid === 1'b1 && ^{m_awaddr, m_awlen, m_awsize, m_awburst} === 1'bx)
            violation("X on the AW payload while awvalid");
        if (m_wvalid === 1'b1 && ^{m_wdata, m_wstrb, m_wlast} === 1'bx)
            violation("X on wdata/wstrb/wlast while wvalid (an output word with unknown bits)");
        if (s_rvalid === 1'b1 && ^{s_rdata, s_rresp} === 1'bx)
            violation("X on s_axi_control rdata while rvalid");
        if (s_bvalid === 1'b1 && ^s_bresp === 1'bx)
            violation("X on s_axi_control bresp while bvalid");
        if (ar_held && (m_arvalid !== 1'b1 || m_araddr !== ar_a || m_arlen !== ar_l))
            violation("AR changed or dropped while stalled");
        if (aw_held && (m_awvalid !== 1'b1 || m_awaddr !== aw_a || m_awlen !== aw_l))
            violation("AW changed or dropped while stalled");
        if (w_held && (m_wvalid !== 1'b1 || m_wdata !== w_d || m_wstrb !== w_s || m_wlast !== w_l))
            violation("W changed or dropped while stalled");
        ar_held = m_arvalid === 1'b1 && !m_arready;
        aw_held = m_awvalid === 1'b1 && !m_awready;
        w_held = m_wvalid === 1'b1 && !m_wready;
        ar_a = m_araddr; ar_l = m_arlen;
        aw_a = m_awaddr; aw_l = m_awlen;
        w_d = m_wdata; w_s = m_wstrb; w_l = m_wlast;
    end

    // ---- memory: reads (m_axi_gmem's AR and R channels; its AR rule checks are above) ----
    rd_slave #(.RO(0), .DW(DW)) gmem0 (
        .clk(ap_clk), .rst_n(ap_rst_n),
        .arvalid(m_arvalid), .arready(m_arready), .araddr(m_araddr), .arlen(m_arlen),
        .arsize(m_arsize), .arburst(m_arburst),
        .rvalid(m_rvalid), .rready(m_rready), .rdata(m_rdata), .rlast(m_rlast), .rresp(m_rresp)
    );

    // ---- memory: writes ----
    reg [63:0] awq_a [0:QD-1];
    reg [8:0] awq_n [0:QD-1];
    integer awq_wp = 0, awq_rp = 0;  // queue of accepted write bursts
    integer w_beat = 0;              // beats of the head burst written so far
    integer b_owed = 0;              // B responses not yet presented
    reg [63:0] wa;
    integer i, j;
    always @(posedge ap_clk) begin
        if (!ap_rst_n) begin
            m_awready <= 1'b0; m_wready <= 1'b0; m_bvalid <= 1'b0;
            awq_wp = 0; awq_rp = 0; w_beat = 0; b_owed = 0;
        end else begin
            if (m_awvalid === 1'b1 && m_awready) begin
                if (!burst_ok(m_awaddr, m_awlen, m_awsize, m_awburst))
                    violation("AW burst not INCR of aligned DW-bit beats within one 4 KiB page");
                if (!in_mem(m_awaddr, {1'b0, m_awlen} + 9'd1))
                    violation("AW burst outside device memory");
                awq_a[awq_wp % QD] = m_awaddr;
                awq_n[awq_wp % QD] = {1'b0, m_awlen} + 9'd1;
                awq_wp = awq_wp + 1;
            end
            if (m_wvalid === 1'b1 && m_wready) begin
                if (awq_rp == awq_wp) violation("W beat before the AW of its burst");
                else begin
                    wa = awq_a[awq_rp % QD] + NB * w_beat;
                    if (m_wlast !== (w_beat + 1 == awq_n[awq_rp % QD]))
                        violation("wlast not exactly on the last beat of the burst");
                    if (in_mem(wa, 9'd1))
                        for (i = 0; i < NW; i = i + 1)
                            for (j = 0; j < 8; j = j + 1)
                                if (m_wstrb[8*i + j] !== 1'b0)
                                    mem[((wa - BASE) >> 3) + i][8*j +: 8] = m_wdata[64*i + 8*j +: 8];
                    w_beat = w_beat + 1;
                    if (w_beat == awq_n[awq_rp % QD]) begin
                        w_beat = 0;
                        awq_rp = awq_rp + 1;
                        b_owed = b_owed + 1;
                    end
                end
            end
            m_awready <= (awq_wp - awq_rp < QD - 1) && go(0);
            m_wready <= go(0);
            if (!m_bvalid || m_bready === 1'b1) begin
                if (b_owed > 0 && go(0)) begin
                    m_bvalid <= 1'b1;
                    b_owed = b_owed - 1;
                end else m_bvalid <= 1'b0;
            end
        end
    end

    // ---- host side of s_axi_control ----
    reg [63:0] t_start = 64'd0, last_run = 64'd0;
    reg [31:0] sticky = 32'd0;  // AP_CTRL clear-on-read bits a poll saw, for the next R 0
    reg ok;

    task axil_write(input [11:0] a, input [31:0] d);
        integer n;
        reg aw_done, w_done, b_done;
        begin
            s_awaddr <= a; s_awvalid <= 1'b1;
            s_wdata <= d; s_wstrb <= 4'hf; s_wvalid <= 1'b1;
            s_bready <= 1'b1;
            aw_done = 1'b0; w_done = 1'b0; b_done = 1'b0;
            n = 0;
            while (!b_done && n < AXIL_WAIT) begin
                @(posedge ap_clk);
                n = n + 1;
                if (s_awvalid && s_awready === 1'b1) begin aw_done = 1'b1; s_awvalid <= 1'b0; end
                if (s_wvalid && s_wready === 1'b1) begin
                    w_done = 1'b1; s_wvalid <= 1'b0;
                    if (a == 12'h000 && d[0]) t_start = cycle;  // ap_start written
                end
                if (aw_done && w_done && s_bready && s_bvalid === 1'b1) b_done = 1'b1;
            end
            s_awvalid <= 1'b0; s_wvalid <= 1'b0; s_bready <= 1'b0;
            ok = b_done;
            if (!b_done) violation("s_axi_control write not answered");
        end
    endtask

    task axil_read(input [11:0] a, output [31:0] d);
        integer n;
        reg ar_done, r_done;
        begin
            s_araddr <= a; s_arvalid <= 1'b1; s_rready <= 1'b1;
            ar_done = 1'b0; r_done = 1'b0; d = 32'hxxxxxxxx;
            n = 0;
            while (!r_done && n < AXIL_WAIT) begin
                @(posedge ap_clk);
                n = n + 1;
                if (s_arvalid && s_arready === 1'b1) begin ar_done = 1'b1; s_arvalid <= 1'b0; end
                if (ar_done && s_rready && s_rvalid === 1'b1) begin r_done = 1'b1; d = s_rdata; end
            end
            s_arvalid <= 1'b0; s_rready <= 1'b0;
            ok = r_done;
            if (!r_done) violation("s_axi_control read not answered");
        end
    endtask

    reg [8*8-1:0] cmd;
    reg [63:0] a, b, ran;
    reg [31:0] v;
    reg done_seen;
    integer r;
    initial begin
        if (!$value$plusargs("seed=%d", seed)) seed = 1;
        if (!$value$plusargs("stall=%d", stall)) stall = 0;
        repeat (8) @(posedge ap_clk);
        ap_rst_n <= 1'b1;
        repeat (2) @(posedge ap_clk);
        checking = 1'b1;
        $fdisplay(STDOUT, "READY %0d", MEM_WORDS);
        $fflush(STDOUT);
        forever begin
            r = $fscanf(STDIN, "%s %h %h", cmd, a, b);
            if (r != 3) $finish;
            if (cmd == "W") begin
                axil_write(a[11:0], b[31:0]);
                if (ok) $fdisplay(STDOUT, "OK"); else $fdisplay(STDOUT, "ERR write %h", a[11:0]);
            end else if (cmd == "R") begin
                axil_read(a[11:0], v);
                if (a[11:0] == 12'h000) begin v = v | sticky; sticky = 32'd0; end
                if (ok) $fdisplay(STDOUT, "OK %h", v); else $fdisplay(STDOUT, "ERR read %h", a[11:0]);
            end else if (cmd == "L") begin
                $readmemh("in.hex", mem, a, a + b - 1);
                $fdisplay(STDOUT, "OK");
            end else if (cmd == "D") begin
                $writememh("out.hex", mem, a, a + b - 1);
                $fdisplay(STDOUT, "OK");
            end else if (cmd == "C") begin
                ran = cycle;
                done_seen = 1'b0;
                ok = 1'b1;
                while (!done_seen && ok && cycle - ran < a) begin
                    axil_read(12'h000, v);
                    if (ok && v[1] === 1'b1) begin
                        done_seen = 1'b1;
                        sticky = sticky | (v & 32'h0000_000a);
                        last_run = cycle - t_start;
                    end
                end
                if (ok) $fdisplay(STDOUT, "OK %0d %0d %0d", done_seen, cycle - ran, last_run);
                else $fdisplay(STDOUT, "ERR poll");
            end else if (cmd == "V") begin
                $fdisplay(STDOUT, "OK %0d %0d", violations, cycle);
            end else if (cmd == "Q") begin
                $finish;
            end else $fdisplay(STDOUT, "ERR unknown command %0s", cmd);
            $fflush(STDOUT);
        end
    end
endmodule

// The AR and R channels of an AXI4 slave over axi_tb's memory: queued bursts, beats in order
// with rlast, random stalls, the burst rule checks. `RO`: the slave of a read-only master
// (`m_axi_gmem1`, `m_axi_gmem2`), which also checks its AR and ready pins for X and held
// payloads (axi_tb checks `m_axi_gmem`'s with its other channels) and names the master so in
// its reports. `DW`: the data bits of a beat (axi_tb's `DW`), a beat DW/64 consecutive words.
module rd_slave #(parameter RO = 1, parameter integer DW = 64) (
    input wire clk, input wire rst_n,
    input wire arvalid, output reg arready, input wire [63:0] araddr, input wire [7:0] arlen,
    input wire [2:0] arsize, input wire [1:0] arburst,
    output reg rvalid, input wire rready, output reg [DW-1:0] rdata, output reg rlast,
    output wire [1:0] rresp
);
    localparam integer QD = 64;
    localparam integer NW = DW / 64;
    assign rresp = 2'd0;
    reg [63:0] q_a [0:QD-1];
    reg [8:0] q_n [0:QD-1];
    integer wp = 0, rp = 0, left = 0;
    reg [63:0] a;
    reg [DW-1:0] d;
    integer i;
    reg held = 1'b0;
    reg [63:0] held_a;
    reg [7:0] held_l;
    initial begin arready = 1'b0; rvalid = 1'b0; rlast = 1'b0; rdata = {DW{1'b0}}; end
    always @(posedge clk) if (RO && axi_tb.checking) begin
        if (^{arvalid, rready} === 1'bx)
            axi_tb.violation("X on a read-only master's arvalid/rready");
        if (arvalid === 1'b1 && ^{araddr, arlen, arsize, arburst} === 1'bx)
            axi_tb.violation("X on a read-only master's AR payload while arvalid");
        if (held && (arvalid !== 1'b1 || araddr !== held_a || arlen !== held_l))
            axi_tb.violation("a read-only master's AR changed or dropped while stalled");
        held = arvalid === 1'b1 && !arready;
        held_a = araddr; held_l = arlen;
    end
    always @(posedge clk) begin
        if (!rst_n) begin
            arready <= 1'b0; rvalid <= 1'b0; rlast <= 1'b0;
            wp = 0; rp = 0; left = 0;
        end else begin
            if (arvalid === 1'b1 && arready) begin
                if (!axi_tb.burst_ok(araddr, arlen, arsize, arburst))
                    axi_tb.violation(RO
                        ? "AR burst of a read-only master not INCR of aligned DW-bit beats within one 4 KiB page"
                        : "AR burst not INCR of aligned DW-bit beats within one 4 KiB page");
                if (!axi_tb.in_mem(araddr, {1'b0, arlen} + 9'd1))
                    axi_tb.violation(RO
                        ? "AR burst of a read-only master outside device memory"
                        : "AR burst outside device memory");
                q_a[wp % QD] = araddr;
                q_n[wp % QD] = {1'b0, arlen} + 9'd1;
                wp = wp + 1;
            end
            arready <= (wp - rp < QD - 1) && axi_tb.go(0);
            if (!rvalid || rready === 1'b1) begin
                if (left == 0 && rp != wp) begin
                    a = q_a[rp % QD];
                    left = q_n[rp % QD];
                    rp = rp + 1;
                end
                if (left > 0 && axi_tb.go(0)) begin
                    rvalid <= 1'b1;
                    d = {DW{1'bx}};
                    if (axi_tb.in_mem(a, 9'd1))
                        for (i = 0; i < NW; i = i + 1)
                            d[64*i +: 64] = axi_tb.mem[((a - axi_tb.BASE) >> 3) + i];
                    rdata <= d;
                    rlast <= (left == 1);
                    a = a + DW / 8;
                    left = left - 1;
                end else begin
                    rvalid <= 1'b0;
                    rlast <= 1'b0;
                end
            end
        end
    end
endmodule
