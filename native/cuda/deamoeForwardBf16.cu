// The DeaMoE kernels for __nv_bfloat16 (see deamoeForward.cuh); one file per dtype so they build in parallel.
#include "deamoeForward.cuh"

namespace deamoe
{
namespace detail
{

TypedOps const& typedOpsBf16()
{
    return typedOps<__nv_bfloat16>();
}

} // namespace detail
} // namespace deamoe
