// The DeaMoE kernels for __half (see deamoeForward.cuh); one file per dtype so they build in parallel.
#include "deamoeForward.cuh"

namespace deamoe
{
namespace detail
{

TypedOps const& typedOpsHalf()
{
    return typedOps<__half>();
}

} // namespace detail
} // namespace deamoe
