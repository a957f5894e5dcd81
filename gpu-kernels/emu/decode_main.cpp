// Runs attention_decode.cu's partial and merge kernels on the CPU (see shim.h) against a
// double-precision reference: the launches, grids, chunking and shared memory of
// host/src/backend/cuda/ops/attention_decode.rs, on small random problems (lengths off every
// tile, block and chunk, empty chunks, GQA 1/2/4/8/12 rows, d 64/128/256, Nq 1..3), contiguous
// and paged (shuffled block table, NaN in every cache row no sequence owns, table entries past
// a sequence -1), every output NaN-poisoned first; then a bad length and bad block ids (NaN
// for that sequence only). The shared memory is poisoned before every block and its bytes
// past the host's size checked after it.
//   gpu-kernels/emu/run_decode.sh              (deferred cp.async)
//   EMU_EAGER=1 gpu-kernels/emu/run_decode.sh  (cp.async copies land at once; the odd warps
//                                              slowed, see emu_skew; EMU_SKEW=0: not)
//   EMU_CASES=2 gpu-kernels/emu/run_decode.sh  (the first two cases only)
//   EMU_DEFINES="-DDEC_TILE_ELEMS=16384 -DDEC_STAGES=3 -DDEC_PAGED_STAGES=2" gpu-kernels/emu/run_decode.sh
//                                              (another ring, as DecodeRing::defines builds)
#include "shim.h"
#include "kernels.inc"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

typedef void (*PartialFn)(const h16_t*, const h16_t*, const h16_t*, const int*, const int*, float*, float*,
                          h16_t*, float*, int, int, int, int, int, int, int, int, float);
typedef void (*MergeFn)(const float*, const float*, h16_t*, float*, int);

#define DEC_FNS(P, D)                                                                          \
    {{attn_decode_##P##_d##D##_r1, attn_decode_##P##_d##D##_r2, attn_decode_##P##_d##D##_r4,     \
      attn_decode_##P##_d##D##_r8},                                                              \
     {attn_decode_paged_##P##_d##D##_r1, attn_decode_paged_##P##_d##D##_r2,                      \
      attn_decode_paged_##P##_d##D##_r4, attn_decode_paged_##P##_d##D##_r8}}
// [prec][d index][paged][rb index]
static const PartialFn PARTIAL[2][3][2][4] = {
    {DEC_FNS(bf16, 64), DEC_FNS(bf16, 128), DEC_FNS(bf16, 256)},
    {DEC_FNS(f16, 64), DEC_FNS(f16, 128), DEC_FNS(f16, 256)},
};
static const MergeFn MERGE[2][3] = {
    {attn_decode_merge_bf16_d64, attn_decode_merge_bf16_d128, attn_decode_merge_bf16_d256},
    {attn_decode_merge_f16_d64, attn_decode_merge_f16_d128, attn_decode_merge_f16_d256},
};
static const int ROW_BLOCKS[4] = {1, 2, 4, 8};

// The host's numbers (DecodeRing in gpu-kernels/src/lib.rs): keys per tile and dynamic shared
// memory, for the ring the kernels were built with (EMU_DEFINES="-DDEC_TILE_ELEMS=.. -DDEC_STAGES=..").
static int keys_per_tile(int d, int rows) {
    return (DEC_HEAVY(d, rows) ? DEC_HEAVY_TILE_ELEMS : DEC_TILE_ELEMS) / d;
}
static size_t smem_bytes(int d, int rows, bool paged) {
    const int ns = DEC_HEAVY(d, rows) ? DEC_HEAVY_STAGES : paged ? DEC_PAGED_STAGES : DEC_STAGES;
    return (size_t)ns * 2 * keys_per_tile(d, rows) * d * 2;
}
static const unsigned char SENTINEL = 0xA5;

static void launch(unsigned gx, unsigned gy, unsigned gz, unsigned threads, size_t smem,
                   const std::function<void()>& f) {
    blockDim.x = threads;
    gridDim.x = gx;
    gridDim.y = gy;
    gridDim.z = gz;
    for (unsigned bz = 0; bz < gz; ++bz)
        for (unsigned by = 0; by < gy; ++by)
            for (unsigned bx = 0; bx < gx; ++bx) {
                // stale values would be NaN (bf16 0xFFFF and f16 0xFFFF are NaN), bytes past
                // the host's size a sentinel
                std::memset(dec_smem, 0xFF, smem);
                std::memset(dec_smem + smem, SENTINEL, sizeof(dec_smem) - smem);
                emu_run_block(threads, bx, by, bz, f);
                for (size_t i = smem; i < sizeof(dec_smem); ++i)
                    if (dec_smem[i] != SENTINEL) {
                        std::printf("block (%u,%u,%u) wrote shared memory byte %zu past %zu\n", bx, by, bz, i, smem);
                        std::exit(2);
                    }
            }
}

struct Case {
    int hq, hkv, nq, d;
    std::vector<int> lens;
    int nmax;                // contiguous capacity
    int chunks;              // forced chunk count (the host's TANDEM_DECODE_CHUNKS path)
    std::vector<int> blocks; // paged block sizes run besides the contiguous cache
    const char* what;
};

struct Problem {
    int prec;
    int B, hq, hkv, nq, d, cap;
    std::vector<int> lens;
    bool paged = false;
    int bs = 0, max_blocks = 0, num_blocks = 0;
    std::vector<h16_t> q, k, v;  // k, v: [B, Hkv, cap, D] or [num_blocks, Hkv, bs, D]
    std::vector<int> table;
};

static float val(int prec, h16_t b) { return prec == 0 ? bf16_float(b) : f16_float(b); }
static h16_t bits(int prec, float f) { return prec == 0 ? bf16_bits(f) : f16_bits(f); }
static h16_t nan_bits(int prec) { return prec == 0 ? 0x7FC0 : 0x7E00; }

// The f64 reference: o [B, Hq, Nq, D] and the natural-log LSE [B, Hq, Nq], from contiguous data.
static void reference(const Problem& p, std::vector<double>& o, std::vector<double>& lse) {
    const double scale = 1.0 / std::sqrt((double)p.d);
    o.assign((size_t)p.B * p.hq * p.nq * p.d, 0.0);
    lse.assign((size_t)p.B * p.hq * p.nq, 0.0);
    for (int b = 0; b < p.B; ++b)
        for (int h = 0; h < p.hq; ++h) {
            const int g = h / (p.hq / p.hkv);
            for (int i = 0; i < p.nq; ++i) {
                const int seen = p.lens[b] - p.nq + i + 1;
                const size_t row = ((size_t)b * p.hq + h) * p.nq + i;
                std::vector<double> s(seen);
                double m = -INFINITY;
                for (int j = 0; j < seen; ++j) {
                    double acc = 0;
                    for (int e = 0; e < p.d; ++e)
                        acc += (double)val(p.prec, p.q[row * p.d + e]) *
                               val(p.prec, p.k[(((size_t)b * p.hkv + g) * p.cap + j) * p.d + e]);
                    s[j] = acc * scale;
                    m = std::max(m, s[j]);
                }
                double l = 0;
                for (int j = 0; j < seen; ++j) {
                    const double w = std::exp(s[j] - m);
                    l += w;
                    for (int e = 0; e < p.d; ++e)
                        o[row * p.d + e] += w * val(p.prec, p.v[(((size_t)b * p.hkv + g) * p.cap + j) * p.d + e]);
                }
                for (int e = 0; e < p.d; ++e) o[row * p.d + e] /= l;
                lse[row] = m + std::log(l);
            }
        }
}

static Problem contiguous(const Case& c, int prec, std::mt19937& rng) {
    Problem p;
    p.prec = prec;
    p.B = (int)c.lens.size();
    p.hq = c.hq; p.hkv = c.hkv; p.nq = c.nq; p.d = c.d; p.cap = c.nmax;
    p.lens = c.lens;
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    p.q.resize((size_t)p.B * p.hq * p.nq * p.d);
    for (auto& x : p.q) x = bits(prec, U(rng));
    const size_t n = (size_t)p.B * p.hkv * p.cap * p.d;
    p.k.resize(n);
    p.v.resize(n);
    for (int b = 0; b < p.B; ++b)
        for (int g = 0; g < p.hkv; ++g)
            for (int t = 0; t < p.cap; ++t)
                for (int e = 0; e < p.d; ++e) {
                    const size_t i = (((size_t)b * p.hkv + g) * p.cap + t) * p.d + e;
                    p.k[i] = t < p.lens[b] ? bits(prec, U(rng)) : nan_bits(prec);
                    p.v[i] = t < p.lens[b] ? bits(prec, U(rng)) : nan_bits(prec);
                }
    return p;
}

// The same data in a paged cache of `bs`-token blocks at shuffled places among `spare` more.
static Problem paged(const Problem& c, int bs, int spare, std::mt19937& rng) {
    Problem p = c;
    p.paged = true;
    p.bs = bs;
    p.max_blocks = (c.cap + bs - 1) / bs;
    p.cap = p.max_blocks * bs;
    int used = 0;
    for (int l : c.lens) used += (l + bs - 1) / bs;
    p.num_blocks = used + spare;
    std::vector<int> ids(p.num_blocks);
    for (int i = 0; i < p.num_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    p.table.assign((size_t)p.B * p.max_blocks, -1);
    const size_t n = (size_t)p.num_blocks * p.hkv * bs * p.d;
    p.k.assign(n, nan_bits(c.prec));
    p.v.assign(n, nan_bits(c.prec));
    int next = 0;
    for (int b = 0; b < p.B; ++b)
        for (int j = 0; j < (c.lens[b] + bs - 1) / bs; ++j) {
            const int blk = ids[next++];
            p.table[(size_t)b * p.max_blocks + j] = blk;
            for (int t = j * bs; t < std::min((j + 1) * bs, c.lens[b]); ++t)
                for (int g = 0; g < p.hkv; ++g)
                    for (int e = 0; e < p.d; ++e) {
                        const size_t src = (((size_t)b * p.hkv + g) * c.cap + t) * p.d + e;
                        const size_t dst = (((size_t)blk * p.hkv + g) * bs + (t - j * bs)) * p.d + e;
                        p.k[dst] = c.k[src];
                        p.v[dst] = c.v[src];
                    }
        }
    return p;
}

struct Out {
    std::vector<h16_t> o;
    std::vector<float> lse;
    std::string kernel;
};

// The host's plan and launches (attention_decode.rs), outputs poisoned first.
static Out run(const Problem& p, int forced_chunks) {
    const int group = p.hq / p.hkv * p.nq;
    int ri = 3;
    for (int i = 0; i < 4; ++i)
        if (ROW_BLOCKS[i] >= group) { ri = i; break; }
    const int rows = ROW_BLOCKS[ri];
    const int row_groups = (group + rows - 1) / rows;
    const int tile = keys_per_tile(p.d, rows);
    const int chunks0 = std::max(1, forced_chunks);
    int chunk_len = (p.cap + chunks0 - 1) / chunks0;
    chunk_len = (chunk_len + tile - 1) / tile * tile;
    const int chunks = (p.cap + chunk_len - 1) / chunk_len;
    const int di = p.d == 64 ? 0 : p.d == 128 ? 1 : 2;
    PartialFn partial = PARTIAL[p.prec][di][p.paged ? 1 : 0][ri];
    MergeFn merge = MERGE[p.prec][di];
    const int rows_total = p.B * p.hq * p.nq;
    std::vector<float> part_o((size_t)rows_total * chunks * p.d, NAN), part_lse((size_t)rows_total * chunks, NAN);
    const float scale_log2 = (float)(1.0 / std::sqrt((double)p.d)) * 1.4426950408889634f;
    int block_log2 = 0;
    while ((1 << block_log2) < (p.paged ? p.bs : p.cap)) ++block_log2;
    if (!p.paged) block_log2 = __builtin_ctz((unsigned)p.cap);  // as the host: unused
    const int* table = p.paged ? p.table.data() : nullptr;
    Out out;
    out.o.assign((size_t)rows_total * p.d, nan_bits(p.prec));
    out.lse.assign(rows_total, NAN);
    // one chunk: the partial writes o and lse itself, no merge (as the host launches it)
    const bool direct = chunks == 1;
    launch(chunks, p.hkv * row_groups, p.B, 128, smem_bytes(p.d, rows, p.paged), [&] {
        partial(p.q.data(), p.k.data(), p.v.data(), p.lens.data(), table, direct ? nullptr : part_o.data(),
                direct ? nullptr : part_lse.data(), direct ? out.o.data() : nullptr,
                direct ? out.lse.data() : nullptr, p.hq, p.hkv, p.nq, p.cap, block_log2, p.max_blocks,
                p.num_blocks, chunk_len, scale_log2);
    });
    if (!direct)
        launch(rows_total, 1, 1, 128, 0,
               [&] { merge(part_o.data(), part_lse.data(), out.o.data(), out.lse.data(), chunks); });
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s_r%d x%d groups, %d chunk%s of %d%s", p.paged ? "paged" : "contiguous", rows,
                  row_groups, chunks, direct ? "" : "s", chunk_len, direct ? ", no merge" : "");
    out.kernel = buf;
    return out;
}

// Rows of sequences in `seqs` compared with the reference; returns true when within tolerance.
static bool compare(const Problem& p, const Out& out, const std::vector<double>& ro, const std::vector<double>& rl,
                    const std::vector<int>& seqs, double& eo, double& el) {
    const double tol = p.prec == 0 ? 8e-3 : 1.5e-3;
    eo = 0;
    el = 0;
    bool ok = true;
    const size_t per = (size_t)p.hq * p.nq;
    for (int b : seqs)
        for (size_t r = b * per; r < (b + 1) * per; ++r) {
            for (int e = 0; e < p.d; ++e) {
                const double x = val(p.prec, out.o[r * p.d + e]);
                const double err = std::fabs(x - ro[r * p.d + e]);
                if (!(err <= tol)) ok = false;
                if (std::isnan(x)) eo = INFINITY;
                else eo = std::max(eo, err);
            }
            const double err = std::fabs(out.lse[r] - rl[r]) / std::max(1.0, std::fabs(rl[r]));
            if (!(err <= 1e-4)) ok = false;
            if (std::isnan(out.lse[r])) el = INFINITY;
            else el = std::max(el, err);
        }
    return ok;
}

static bool all_nan(const Problem& p, const Out& out, int b) {
    const size_t per = (size_t)p.hq * p.nq;
    for (size_t r = b * per; r < (b + 1) * per; ++r) {
        if (!std::isnan(out.lse[r])) return false;
        for (int e = 0; e < p.d; ++e)
            if (!std::isnan(val(p.prec, out.o[r * p.d + e]))) return false;
    }
    return true;
}

static int report(bool ok, const Problem& p, const Out& out, const char* what, double eo, double el) {
    std::printf("%s %-5s d%-3d Hq%d Hkv%d Nq%d %-44s %-22s max|o err| %.1e lse rel %.1e\n", ok ? "ok  " : "FAIL",
                p.prec == 0 ? "bf16" : "f16", p.d, p.hq, p.hkv, p.nq, out.kernel.c_str(), what, eo, el);
    return ok ? 0 : 1;
}

static int run_case(const Case& c, int prec, std::mt19937& rng) {
    Problem p = contiguous(c, prec, rng);
    std::vector<double> ro, rl;
    reference(p, ro, rl);
    std::vector<int> every(p.B);
    for (int b = 0; b < p.B; ++b) every[b] = b;
    int fails = 0;
    double eo = 0, el = 0;
    Out out = run(p, c.chunks);
    bool ok = compare(p, out, ro, rl, every, eo, el);
    fails += report(ok, p, out, c.what, eo, el);
    for (int bs : c.blocks) {
        Problem pp = paged(p, bs, 3, rng);
        Out po = run(pp, c.chunks);
        char what[64];
        std::snprintf(what, sizeof what, "block %d", bs);
        ok = compare(pp, po, ro, rl, every, eo, el);
        fails += report(ok, pp, po, what, eo, el);
    }
    return fails;
}

// A length past the capacity, a block id past the cache and a -1 inside a sequence: NaN for
// that sequence, the others right.
// Bad lengths and block ids, split in 2 chunks (merged) and in 1 (no merge).
static int run_bad(int prec, std::mt19937& rng) {
    int fails = 0;
    for (int chunks : {2, 1}) {
        const Case c{8, 2, 1, 128, {150, 97}, 150, chunks, {}, "bad values"};
        Problem p = contiguous(c, prec, rng);
        std::vector<double> ro, rl;
        reference(p, ro, rl);
        double eo = 0, el = 0;
        Problem bad = p;
        bad.lens[1] = 1000000;
        Out out = run(bad, c.chunks);
        bool ok = compare(p, out, ro, rl, {0}, eo, el) && all_nan(p, out, 1);
        fails += report(ok, p, out, "length past capacity", eo, el);
        for (int id : {1 << 30, -1}) {
            Problem pp = paged(p, 16, 0, rng);
            pp.table[(size_t)1 * pp.max_blocks + 3] = id;
            Out po = run(pp, c.chunks);
            char what[64];
            std::snprintf(what, sizeof what, "block id %d", id);
            ok = compare(pp, po, ro, rl, {0}, eo, el) && all_nan(pp, po, 1);
            fails += report(ok, pp, po, what, eo, el);
        }
    }
    return fails;
}

int main() {
    emu_eager = std::getenv("EMU_EAGER") && std::getenv("EMU_EAGER")[0] == '1';
    emu_skew = emu_eager && !(std::getenv("EMU_SKEW") && std::getenv("EMU_SKEW")[0] == '0');
    std::mt19937 rng(20261127);
    const std::vector<Case> cases = {
        // hq hkv nq d    lens               nmax chunks blocks
        {8, 2, 1, 128, {5, 100, 257}, 260, 3, {16, 64}, "GQA 4 (the target's group)"},
        {8, 2, 1, 128, {700, 1, 333}, 700, 2, {16}, "GQA 4, 11 tiles a chunk"},
        {2, 2, 1, 64, {1, 37, 600}, 601, 2, {16, 1}, "MHA, empty chunks"},
        {8, 1, 1, 128, {33, 400}, 410, 2, {16, 128}, "GQA 8"},
        {4, 1, 3, 64, {3, 70}, 75, 1, {4}, "Nq 3: 12 rows, 2 groups"},
        {2, 1, 1, 256, {61, 19}, 64, 2, {32}, "d256, 2 rows"},
        {4, 4, 2, 128, {2, 45}, 50, 1, {8}, "Nq 2, 2 rows"},
        {8, 1, 1, 256, {40}, 41, 1, {16}, "d256, 8 rows"},
        {4, 1, 1, 64, {90, 200}, 201, 4, {16}, "d64, 4 rows, 4 chunks"},
        {4, 2, 1, 128, {300}, 333, 1, {}, "one chunk, many tiles"},
    };
    int fails = 0;
    const char* lim = std::getenv("EMU_CASES");
    const int ncases = lim ? std::atoi(lim) : (int)cases.size();
    for (int ci = 0; ci < ncases && ci < (int)cases.size(); ++ci)
        for (int prec = 0; prec < 2; ++prec) fails += run_case(cases[ci], prec, rng);
    if (!lim)
        for (int prec = 0; prec < 2; ++prec) fails += run_bad(prec, rng);
    std::printf("%s (%s cp.async%s)\n", fails ? "FAILED" : "all passed", emu_eager ? "eager" : "deferred",
                emu_skew ? ", odd warps slowed" : "");
    return fails ? 1 : 0;
}
