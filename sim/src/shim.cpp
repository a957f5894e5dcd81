// C ABI shim around a Verilated tandem kernel (top class Vtop). Every kernel has the same
// Vitis port list (the shell is common), so one shim serves all of them.
#include <cstdint>
#include <memory>
#include "Vtop.h"
#include "verilated.h"
#include "verilated_vcd_c.h"

// The m_axi_gmem data bus is 64 bits (Verilator: QData) or wider (VlWide<N>, 32-bit words).
static void set_bus(QData& d, const uint64_t* w) { d = w[0]; }
template <std::size_t N>
static void set_bus(VlWide<N>& d, const uint64_t* w) {
    for (std::size_t i = 0; i < N; i++) d[i] = static_cast<EData>(w[i / 2] >> (32 * (i % 2)));
}
static void get_bus(const QData& d, uint64_t* w) {
    w[0] = d;
    for (int i = 1; i < 8; i++) w[i] = 0;
}
template <std::size_t N>
static void get_bus(const VlWide<N>& d, uint64_t* w) {
    for (int i = 0; i < 8; i++) w[i] = 0;
    for (std::size_t i = 0; i < N; i++) w[i / 2] |= static_cast<uint64_t>(d[i]) << (32 * (i % 2));
}

extern "C" {

struct TsimIn {
    uint64_t ap_rst_n;
    uint64_t s_awvalid, s_awaddr, s_wvalid, s_wdata, s_wstrb, s_bready, s_arvalid, s_araddr, s_rready;
    uint64_t m_awready, m_wready, m_bvalid, m_bresp, m_arready, m_rvalid, m_rdata, m_rlast, m_rresp;
    uint64_t m_rdata_w[8];  // the whole R beat, 64 bits a word (up to 512 bits)
    // the read-only m_axi_gmem1 and m_axi_gmem2 (index 0 and 1) of a three-master kernel
    uint64_t x_arready[2], x_rvalid[2], x_rlast[2], x_rresp[2];
    uint64_t x_rdata_w[2][8];
};

struct TsimOut {
    uint64_t s_awready, s_wready, s_bvalid, s_bresp, s_arready, s_rvalid, s_rdata, s_rresp;
    uint64_t m_awvalid, m_awaddr, m_awlen, m_wvalid, m_wdata, m_wstrb, m_wlast, m_bready;
    uint64_t m_arvalid, m_araddr, m_arlen, m_rready;
    uint64_t interrupt;
    uint64_t m_wdata_w[8];  // the whole W beat, 64 bits a word (up to 512 bits)
    uint64_t x_arvalid[2], x_araddr[2], x_arlen[2], x_rready[2];
};

struct Tsim {
    VerilatedContext ctx;
    std::unique_ptr<Vtop> top;
    std::unique_ptr<VerilatedVcdC> vcd;
    uint64_t time = 0;
};

uint32_t tsim_abi_version() { return 3; }

void* tsim_new(const char* vcd_path) {
    Tsim* s = new Tsim();
    if (vcd_path) s->ctx.traceEverOn(true);
    s->top.reset(new Vtop(&s->ctx, "top"));
    if (vcd_path) {
        s->vcd.reset(new VerilatedVcdC());
        s->top->trace(s->vcd.get(), 99);
        s->vcd->open(vcd_path);
    }
    s->top->ap_clk = 0;
    s->top->eval();
    return s;
}

void tsim_free(void* h) {
    Tsim* s = static_cast<Tsim*>(h);
    if (s->vcd) s->vcd->close();
    s->top->final();
    delete s;
}

// Sets the inputs with the clock low, settles, and reads the outputs.
void tsim_eval(void* h, const TsimIn* i, TsimOut* o) {
    Tsim* s = static_cast<Tsim*>(h);
    Vtop* t = s->top.get();
    t->ap_clk = 0;
    t->ap_rst_n = i->ap_rst_n;
    t->s_axi_control_awvalid = i->s_awvalid;
    t->s_axi_control_awaddr = i->s_awaddr;
    t->s_axi_control_wvalid = i->s_wvalid;
    t->s_axi_control_wdata = i->s_wdata;
    t->s_axi_control_wstrb = i->s_wstrb;
    t->s_axi_control_bready = i->s_bready;
    t->s_axi_control_arvalid = i->s_arvalid;
    t->s_axi_control_araddr = i->s_araddr;
    t->s_axi_control_rready = i->s_rready;
    t->m_axi_gmem_awready = i->m_awready;
    t->m_axi_gmem_wready = i->m_wready;
    t->m_axi_gmem_bvalid = i->m_bvalid;
    t->m_axi_gmem_bresp = i->m_bresp;
    t->m_axi_gmem_arready = i->m_arready;
    t->m_axi_gmem_rvalid = i->m_rvalid;
    set_bus(t->m_axi_gmem_rdata, i->m_rdata_w);
    t->m_axi_gmem_rlast = i->m_rlast;
    t->m_axi_gmem_rresp = i->m_rresp;
#ifdef TSIM_MULTI  // built for a kernel with m_axi_gmem1 and m_axi_gmem2
    t->m_axi_gmem1_arready = i->x_arready[0];
    t->m_axi_gmem1_rvalid = i->x_rvalid[0];
    set_bus(t->m_axi_gmem1_rdata, i->x_rdata_w[0]);
    t->m_axi_gmem1_rlast = i->x_rlast[0];
    t->m_axi_gmem1_rresp = i->x_rresp[0];
    t->m_axi_gmem2_arready = i->x_arready[1];
    t->m_axi_gmem2_rvalid = i->x_rvalid[1];
    set_bus(t->m_axi_gmem2_rdata, i->x_rdata_w[1]);
    t->m_axi_gmem2_rlast = i->x_rlast[1];
    t->m_axi_gmem2_rresp = i->x_rresp[1];
#endif
    t->eval();
    if (s->vcd) s->vcd->dump(s->time);
    o->s_awready = t->s_axi_control_awready;
    o->s_wready = t->s_axi_control_wready;
    o->s_bvalid = t->s_axi_control_bvalid;
    o->s_bresp = t->s_axi_control_bresp;
    o->s_arready = t->s_axi_control_arready;
    o->s_rvalid = t->s_axi_control_rvalid;
    o->s_rdata = t->s_axi_control_rdata;
    o->s_rresp = t->s_axi_control_rresp;
    o->m_awvalid = t->m_axi_gmem_awvalid;
    o->m_awaddr = t->m_axi_gmem_awaddr;
    o->m_awlen = t->m_axi_gmem_awlen;
    o->m_wvalid = t->m_axi_gmem_wvalid;
    get_bus(t->m_axi_gmem_wdata, o->m_wdata_w);
    o->m_wdata = o->m_wdata_w[0];
    o->m_wstrb = t->m_axi_gmem_wstrb;
    o->m_wlast = t->m_axi_gmem_wlast;
    o->m_bready = t->m_axi_gmem_bready;
    o->m_arvalid = t->m_axi_gmem_arvalid;
    o->m_araddr = t->m_axi_gmem_araddr;
    o->m_arlen = t->m_axi_gmem_arlen;
    o->m_rready = t->m_axi_gmem_rready;
#ifdef TSIM_MULTI
    o->x_arvalid[0] = t->m_axi_gmem1_arvalid;
    o->x_araddr[0] = t->m_axi_gmem1_araddr;
    o->x_arlen[0] = t->m_axi_gmem1_arlen;
    o->x_rready[0] = t->m_axi_gmem1_rready;
    o->x_arvalid[1] = t->m_axi_gmem2_arvalid;
    o->x_araddr[1] = t->m_axi_gmem2_araddr;
    o->x_arlen[1] = t->m_axi_gmem2_arlen;
    o->x_rready[1] = t->m_axi_gmem2_rready;
#else
    for (int p = 0; p < 2; p++) o->x_arvalid[p] = o->x_araddr[p] = o->x_arlen[p] = o->x_rready[p] = 0;
#endif
    o->interrupt = t->__SYM__interrupt;  // Verilator renames the C++ word `interrupt`
}

// Rising edge.
void tsim_posedge(void* h) {
    Tsim* s = static_cast<Tsim*>(h);
    s->top->ap_clk = 1;
    s->top->eval();
    if (s->vcd) s->vcd->dump(s->time + 1);
    s->time += 2;
}

}
