//===- TileToGPUIndexConversion.cpp - Index tiles to f32 ------------------===//
//
/// \file
/// A pattern of the elementwise op family (TileToGPUCompute.cpp): the
/// conversion to f32 of an index tile affine in the element's row and
/// column, as a score modifier's position arithmetic makes it (ALiBi's
/// kv_idx - q_idx), by one conversion per column parity and exact adds of
/// constants instead of one conversion per register.
//
//===----------------------------------------------------------------------===//

#include "compiler/Conversion/TileToGPU.h"

#include "mlir/Dialect/Arith/IR/Arith.h"

#include <cstdlib>

using namespace mlir;
using namespace flashjit;
using namespace flashjit::conversion;

namespace {
/// An i32 tile v = a + row * i + col * j (a uniform, i and j the element's
/// row and column index): its coefficients.
struct AffineIndex {
  int64_t row = 0, col = 0;
};
} // namespace

/// The coefficients of \p v if it is built from tile.iota, tile.splat,
/// splat constants, arith.addi and arith.subi alone (kv_idx - q_idx and
/// the like), each at most 16 in magnitude.
static std::optional<AffineIndex> affineIndexOf(Value v, int depth = 0) {
  Operation *def = v.getDefiningOp();
  if (!def || depth > 12)
    return std::nullopt;
  if (auto iota = dyn_cast<tile::IotaOp>(def))
    return iota.getDim() == 0 ? AffineIndex{1, 0} : AffineIndex{0, 1};
  if (isa<tile::SplatOp>(def))
    return AffineIndex{};
  if (auto c = dyn_cast<arith::ConstantOp>(def)) {
    auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
    return dense && dense.isSplat() ? std::optional(AffineIndex{})
                                    : std::nullopt;
  }
  if (!isa<arith::AddIOp, arith::SubIOp>(def))
    return std::nullopt;
  std::optional<AffineIndex> x = affineIndexOf(def->getOperand(0), depth + 1);
  std::optional<AffineIndex> y = affineIndexOf(def->getOperand(1), depth + 1);
  if (!x || !y)
    return std::nullopt;
  const int64_t s = isa<arith::SubIOp>(def) ? -1 : 1;
  AffineIndex r{x->row + s * y->row, x->col + s * y->col};
  if (std::abs(r.row) > 16 || std::abs(r.col) > 16)
    return std::nullopt;
  return r;
}

/// arith.sitofp of a 2-D i32 tile affine in the element's row and column
/// with a column term (affineIndexOf: ALiBi's kv_idx - q_idx): register
/// (mi, ni, e) holds v(0, 0, e % 2) + row (16 mi + 8 (e / 2)) + col 8 ni,
/// so its conversion is that of register (0, 0, e % 2) plus a constant,
/// exact wherever the values lie within 2^24 of 0 (any index of sequences
/// shorter than 2^24 - 512: the same bits as the CPU's sitofp; past that
/// the sum rounds once more). Registers of one constant share their add.
/// Before (a 64 x 128 tile on wgmma, 64 registers a thread):
///
///   %d = arith.subi (iota dim 1 + splat n0), (iota dim 0 + splat m0)
///   %f = arith.sitofp %d : tensor<64x128xi32> to tensor<64x128xf32>
///
/// After, per thread: 2 cvt.rn.f32.s32 of the registers (0, 0, 0) and
/// (0, 0, 1), then one add.f32 of 8 (ni - h) to them per distinct constant
/// (32), where the element-wise form took 34 integer subtractions and 34
/// conversions (ptxas had shared the registers of one value).
std::optional<LogicalResult>
TileKernelLowering::lowerAffineConversion(Operation *op) {
  auto conv = dyn_cast<arith::SIToFPOp>(op);
  if (!conv || !isTile(conv.getIn()) || tileType(conv.getIn()).getRank() != 2 ||
      !tileType(conv.getIn()).getElementType().isInteger(32) ||
      !tileType(conv.getOut()).getElementType().isF32() ||
      !frags.count(conv.getIn()))
    return std::nullopt;
  std::optional<AffineIndex> a = affineIndexOf(conv.getIn());
  if (!a || a->col == 0)
    return std::nullopt;
  const Fragment &in = frags[conv.getIn()];
  const int64_t nt = nTiles(tileType(conv.getIn()));
  if (int64_t(in.regs.size()) != mt * nt * 4)
    return std::nullopt;
  Value base[2] = {arith::SIToFPOp::create(b, g.f32, in.regs[0]),
                   arith::SIToFPOp::create(b, g.f32, in.regs[1])};
  llvm::DenseMap<std::pair<int64_t, int64_t>, Value> sums;
  Fragment out;
  for (int64_t mi = 0; mi < mt; ++mi)
    for (int64_t ni = 0; ni < nt; ++ni)
      for (int64_t e = 0; e < 4; ++e) {
        const int64_t delta =
            a->row * (16 * mi + 8 * (e / 2)) + a->col * 8 * ni;
        Value &sum = sums[{e % 2, delta}];
        if (!sum)
          sum = delta ? g.fadd(base[e % 2], g.cf(double(delta))) : base[e % 2];
        out.regs.push_back(sum);
      }
  frags[conv.getOut()] = std::move(out);
  return success();
}
