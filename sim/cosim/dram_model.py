"""The co-simulation DRAM: an AXI4 slave memory in plain Verilog (module ``gemforge_dram``).

Kept as Python text so it ships with the package like any module (no package data);
`gemforge.sim.cosim.harness` writes it next to the generated top when it builds.
"""

__all__ = ["DRAM_MODEL_VERILOG", "DRAM_MODEL_FILE"]

DRAM_MODEL_FILE = "gemforge_dram.v"

DRAM_MODEL_VERILOG = r"""// gemforge co-simulation DRAM: an AXI4 slave memory in plain Verilog, so no
// Python runs per cycle. Incrementing bursts only (what the accelerator issues).
//
// The memory covers WORDS bus words starting at byte address BASE (plusarg
// +dram_base=<hex>); it is loaded from +dram_in=<file> ($readmemh) at time 0
// and again on the first cycle `reload` is high (then `reloaded` rises), and
// written to +dram_out=<file> ($writememh, words 0..+dram_words-1) on the
// first cycle `dump` is high (then `dumped` rises). Reset re-arms both, so
// one simulation runs many programs: the testbench replaces the input file,
// reloads, runs, dumps, and resets. With +dram_params=<file>, a reload also
// reads three hex words from that file: the window's base, the words to dump
// and the words accessible (a session's programs each have their own window).
// Accesses outside the window set `oob`,
// read 0 and are answered SLVERR (a read beat's RRESP; a write burst's BRESP
// when any of its beats fell outside), as a real interconnect answers an
// unmapped address with an error.
//
// Backpressure and latency: with +stall=<0..255>, each of ARREADY, RVALID,
// AWREADY, WREADY and BVALID is withheld in a cycle with probability
// stall/256, from a free-running LFSR (seed +seed=<n>).
`timescale 1ns/1ps
module gemforge_dram #(
    parameter DATA_BITS = 64,
    parameter WORDS = 1024,
    parameter ID_BITS = 3,
    parameter ADDR_BITS = 32
) (
    input  wire                   clk,
    input  wire                   rst,
    input  wire                   dump,
    input  wire                   reload,
    output reg                    oob,
    output reg                    dumped,
    output reg                    reloaded,
    input  wire [ADDR_BITS-1:0]   araddr,
    input  wire [7:0]             arlen,
    input  wire [ID_BITS-1:0]     arid,
    input  wire                   arvalid,
    output wire                   arready,
    output wire [DATA_BITS-1:0]   rdata,
    output wire [1:0]             rresp,
    output wire                   rlast,
    output wire [ID_BITS-1:0]     rid,
    output wire                   rvalid,
    input  wire                   rready,
    input  wire [ADDR_BITS-1:0]   awaddr,
    input  wire [7:0]             awlen,
    input  wire [ID_BITS-1:0]     awid,
    input  wire                   awvalid,
    output wire                   awready,
    input  wire [DATA_BITS-1:0]   wdata,
    input  wire [DATA_BITS/8-1:0] wstrb,
    input  wire                   wlast,
    input  wire                   wvalid,
    output wire                   wready,
    output wire [1:0]             bresp,
    output wire [ID_BITS-1:0]     bid,
    output wire                   bvalid,
    input  wire                   bready
);
    localparam BYTES = DATA_BITS / 8;
    localparam SHIFT = $clog2(BYTES);
    localparam QBITS = 3;
    localparam QDEPTH = 1 << QBITS;

    reg [DATA_BITS-1:0] mem [0:WORDS-1];
    reg [1023:0] fname_in;
    reg [1023:0] fname_out;
    reg [31:0] base;
    reg [31:0] dump_words;
    reg [31:0] limit_words;
    reg [31:0] params [0:2];
    reg [1023:0] fname_params;
    reg has_params;
    reg [31:0] stall;
    reg [31:0] seed;
    reg [31:0] lfsr;

    initial begin
        base = 0; dump_words = 0; limit_words = WORDS; stall = 0; seed = 1;
        has_params = $value$plusargs("dram_params=%s", fname_params);
        if ($value$plusargs("dram_base=%h", base)) ;
        if ($value$plusargs("dram_words=%d", dump_words)) ;
        if ($value$plusargs("stall=%d", stall)) ;
        if ($value$plusargs("seed=%d", seed)) ;
        if ($value$plusargs("dram_in=%s", fname_in)) $readmemh(fname_in, mem);
        if (!$value$plusargs("dram_out=%s", fname_out)) fname_out = "dram_out.hex";
    end

    // Random stalls.
    always @(posedge clk) begin
        if (rst) lfsr <= seed | 32'h1;
        else lfsr <= {lfsr[30:0], lfsr[31] ^ lfsr[21] ^ lfsr[1] ^ lfsr[0]};
    end
    wire [7:0] r0 = lfsr[7:0] ^ lfsr[31:24];
    wire [7:0] r1 = lfsr[15:8] ^ lfsr[7:0];
    wire [7:0] r2 = lfsr[23:16] ^ lfsr[15:8];
    wire [7:0] r3 = lfsr[31:24] ^ lfsr[23:16];
    wire [7:0] r4 = lfsr[11:4] ^ lfsr[27:20];
    wire stall_ar = {24'b0, r0} < stall;
    wire stall_r  = {24'b0, r1} < stall;
    wire stall_aw = {24'b0, r2} < stall;
    wire stall_w  = {24'b0, r3} < stall;
    wire stall_b  = {24'b0, r4} < stall;

    function [31:0] word_index(input [ADDR_BITS-1:0] addr);
        word_index = (addr - base) >> SHIFT;
    endfunction
    function in_window(input [ADDR_BITS-1:0] addr);
        in_window = (addr >= base) && (((addr - base) >> SHIFT) < limit_words);
    endfunction

    // ---------------------------------------------------------------- reads
    reg [ADDR_BITS-1:0] arq_addr [0:QDEPTH-1];
    reg [7:0]           arq_len  [0:QDEPTH-1];
    reg [ID_BITS-1:0]   arq_id   [0:QDEPTH-1];
    reg [QBITS:0] arq_wp, arq_rp;
    wire [QBITS:0] arq_count = arq_wp - arq_rp;   // modulo 2^(QBITS+1)
    wire arq_full = arq_count == QDEPTH;
    wire arq_empty = arq_wp == arq_rp;
    assign arready = !rst && !arq_full && !stall_ar;

    reg                 r_active;
    reg [ADDR_BITS-1:0] r_addr;
    reg [7:0]           r_left;
    reg [ID_BITS-1:0]   r_id;
    assign rvalid = r_active && !stall_r;
    assign rdata  = in_window(r_addr) ? mem[word_index(r_addr)] : {DATA_BITS{1'b0}};
    assign rresp  = in_window(r_addr) ? 2'b00 : 2'b10;
    assign rlast  = r_left == 0;
    assign rid    = r_id;

    always @(posedge clk) begin
        if (rst) begin
            arq_wp <= 0; arq_rp <= 0; r_active <= 0; oob <= 0;
        end else begin
            if (arvalid && arready) begin
                arq_addr[arq_wp[QBITS-1:0]] <= araddr;
                arq_len[arq_wp[QBITS-1:0]]  <= arlen;
                arq_id[arq_wp[QBITS-1:0]]   <= arid;
                arq_wp <= arq_wp + 1;
            end
            if (rvalid && rready && !in_window(r_addr)) oob <= 1;
            if ((!r_active || (rvalid && rready && rlast)) && !arq_empty) begin
                r_active <= 1;
                r_addr <= arq_addr[arq_rp[QBITS-1:0]];
                r_left <= arq_len[arq_rp[QBITS-1:0]];
                r_id   <= arq_id[arq_rp[QBITS-1:0]];
                arq_rp <= arq_rp + 1;
            end else if (rvalid && rready) begin
                if (rlast) r_active <= 0;
                else begin
                    r_addr <= r_addr + BYTES;
                    r_left <= r_left - 1;
                end
            end
        end
    end

    // ---------------------------------------------------------------- writes
    reg [ADDR_BITS-1:0] awq_addr [0:QDEPTH-1];
    reg [ID_BITS-1:0]   awq_id   [0:QDEPTH-1];
    reg [QBITS:0] awq_wp, awq_rp;
    wire [QBITS:0] awq_count = awq_wp - awq_rp;   // modulo 2^(QBITS+1)
    wire awq_full = awq_count == QDEPTH;
    wire awq_empty = awq_wp == awq_rp;
    assign awready = !rst && !awq_full && !stall_aw;

    reg [ADDR_BITS-1:0] w_addr;
    reg                 w_started;   // w_addr holds the head burst's next address
    wire [ADDR_BITS-1:0] w_cur = w_started ? w_addr : awq_addr[awq_rp[QBITS-1:0]];
    reg [ID_BITS-1:0]   bq_id [0:QDEPTH-1];
    reg                 bq_err [0:QDEPTH-1];
    reg                 w_bad;       // a beat of the current burst fell outside the window
    reg [QBITS:0] bq_wp, bq_rp;
    wire [QBITS:0] bq_count = bq_wp - bq_rp;   // modulo 2^(QBITS+1)
    wire bq_full = bq_count == QDEPTH;
    assign wready = !rst && !awq_empty && !bq_full && !stall_w;
    assign bvalid = (bq_wp != bq_rp) && !stall_b;
    assign bid = bq_id[bq_rp[QBITS-1:0]];
    assign bresp = bq_err[bq_rp[QBITS-1:0]] ? 2'b10 : 2'b00;

    integer i;
    always @(posedge clk) begin
        if (rst) begin
            awq_wp <= 0; awq_rp <= 0; w_started <= 0; bq_wp <= 0; bq_rp <= 0; w_bad <= 0;
        end else begin
            if (awvalid && awready) begin
                awq_addr[awq_wp[QBITS-1:0]] <= awaddr;
                awq_id[awq_wp[QBITS-1:0]]   <= awid;
                awq_wp <= awq_wp + 1;
            end
            if (wvalid && wready) begin
                if (in_window(w_cur)) begin
                    for (i = 0; i < BYTES; i = i + 1)
                        if (wstrb[i]) mem[word_index(w_cur)][i*8 +: 8] <= wdata[i*8 +: 8];
                end else begin
                    oob <= 1;
                    w_bad <= 1;
                end
                if (wlast) begin
                    w_started <= 0;
                    awq_rp <= awq_rp + 1;
                    bq_id[bq_wp[QBITS-1:0]] <= awq_id[awq_rp[QBITS-1:0]];
                    bq_err[bq_wp[QBITS-1:0]] <= w_bad || !in_window(w_cur);
                    w_bad <= 0;
                    bq_wp <= bq_wp + 1;
                end else begin
                    w_started <= 1;
                    w_addr <= w_cur + BYTES;
                end
            end
            if (bvalid && bready) bq_rp <= bq_rp + 1;
        end
    end

    // ---------------------------------------------------------------- reload, dump
    always @(posedge clk) begin
        if (rst) begin
            dumped <= 0; reloaded <= 0;
        end else begin
            if (reload && !reloaded) begin
                $readmemh(fname_in, mem);
                if (has_params) begin
                    $readmemh(fname_params, params);
                    base <= params[0];
                    dump_words <= params[1];
                    limit_words <= params[2];
                end
                reloaded <= 1;
            end
            if (dump && !dumped) begin
                if (dump_words != 0) $writememh(fname_out, mem, 0, dump_words - 1);
                dumped <= 1;
            end
        end
    end
endmodule
"""
