/*
 * DeaMoE forward kernels, templated on the dtype T (float, __half, __nv_bfloat16) and on
 * TT, the token capacity of a step tile rounded up to a power of two (1, 2, 4, 8, 16).
 *
 * One step tile (<= kMaxTileTokens tokens) is three launches on one stream:
 *   K1 routerSharedKernel  router logits (+ the shared-expert gate logit) and the shared
 *                          experts' gate/up -> h_sh = silu(g) * u; zeroes K2's counters
 *   K2 routedKernel        each block takes a ticket in start order: the first
 *                          ceil(T/4) route the tile (a warp per token) and the last of
 *                          them builds the plan; the next ones stream the shared experts'
 *                          down (no dependency on routing, so the routing hides behind
 *                          them); the rest wait for the plan and do the gate/up of every
 *                          used department and expert part for the tokens that use it:
 *                          h = w * silu(g) * u per (token, slot)
 *   K3 downKernel          a block owns 8 output rows: it streams those rows of every used
 *                          part's down projection, accumulates them per token in
 *                          registers, adds the shared experts' output and writes the
 *                          output rows (no partials in memory, no atomics, no fences)
 * K2's gate/up blocks are launched over the worst-case plan (min(D, T*min(g,k))
 * departments, min(N, T*k) experts); blocks beyond the plan's actual counts exit once it is
 * known, so the host never waits on the plan and the whole forward is CUDA-graph
 * capturable.
 *
 * Every weight row is streamed once per tile with 16-byte non-allocating loads; each
 * loaded 16-byte chunk is applied to all of the tokens that use it (up to TT) from
 * registers. Gate/up rows are split over `slices` warps when d is long, so that one warp's
 * share stays small and many warps keep loads in flight (memory-bound GEMV).
 */
#pragma once

// The pieces, in dependency order (each header also includes what it needs):
#include "deamoeDevice.cuh"                // device math: dtypes, loads, PDL, warp GEMV rows
#include "deamoeGemv.cuh"                  // gate/up blocks and down rows shared by the kernels
#include "deamoeRouterSharedKernel.cuh"    // K1
#include "deamoeRoutedKernel.cuh"          // K2
#include "deamoeDownKernel.cuh"            // K3
#include "deamoeRouteKernel.cuh"           // route()
#include "deamoeRouterRowsFloatKernel.cuh" // float32 router rows
#include "deamoeLaunch.cuh"                // launchers and typed entry points
