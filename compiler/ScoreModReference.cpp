//===- ScoreModReference.cpp - A score_mod region in float64 --------------===//
//
/// \file
/// The float64 reference's side of a score_mod region that is no named
/// variant (AttentionSpec::scoreFunction): the region's ops, read once into
/// a list of instructions, evaluated on dual numbers (value, d value /
/// d score), so that the reference gets the modified score and, for the
/// backward, its derivative by a method of its own: the compiler derives
/// the kernel's by the chain rule over the same ops (ScoreMod.cpp), so the
/// two can disagree and a test sees it. Integer and index values carry a
/// zero derivative; every value is a double (integers exactly up to 2^53),
/// so the reference does not round where the kernel computes in f32.
//
//===----------------------------------------------------------------------===//

#include "compiler/CompilerInternal.h"
#include "dialects/Attn/IR/AttnDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>
#include <fmt/format.h>
#include <functional>
#include <vector>

using namespace mlir;

namespace flashjit {
namespace {

/// A value and its derivative with respect to the score.
struct Dual {
  double v = 0, d = 0;
};

/// One op of the region: its operands (indices of earlier values) and how
/// it computes its result from them.
struct Instr {
  std::vector<int> in;
  std::function<Dual(const Dual *)> eval;
  /// A captured tensor's load (memref.load): the tensor, read at in[0].
  int capture = -1;
};

constexpr double kLn2 = 0.69314718055994530942;

bool compareF(arith::CmpFPredicate p, double a, double b) {
  using P = arith::CmpFPredicate;
  const bool unordered = std::isnan(a) || std::isnan(b);
  switch (p) {
  case P::AlwaysFalse:
    return false;
  case P::AlwaysTrue:
    return true;
  case P::OEQ:
    return !unordered && a == b;
  case P::OGT:
    return !unordered && a > b;
  case P::OGE:
    return !unordered && a >= b;
  case P::OLT:
    return !unordered && a < b;
  case P::OLE:
    return !unordered && a <= b;
  case P::ONE:
    return !unordered && a != b;
  case P::ORD:
    return !unordered;
  case P::UEQ:
    return unordered || a == b;
  case P::UGT:
    return unordered || a > b;
  case P::UGE:
    return unordered || a >= b;
  case P::ULT:
    return unordered || a < b;
  case P::ULE:
    return unordered || a <= b;
  case P::UNE:
    return unordered || a != b;
  case P::UNO:
    return unordered;
  }
  return false;
}

bool compareI(arith::CmpIPredicate p, double a, double b) {
  using P = arith::CmpIPredicate;
  switch (p) {
  case P::eq:
    return a == b;
  case P::ne:
    return a != b;
  case P::slt:
  case P::ult:
    return a < b;
  case P::sle:
  case P::ule:
    return a <= b;
  case P::sgt:
  case P::ugt:
    return a > b;
  case P::sge:
  case P::uge:
    return a >= b;
  }
  return false;
}

Dual constant(double v) { return {v, 0}; }

/// How \p op computes its result, or null for an op the reference does not
/// evaluate.
std::function<Dual(const Dual *)> evaluatorOf(Operation *op) {
  using F = std::function<Dual(const Dual *)>;
  auto unary = [](auto value, auto slope) -> F {
    return [=](const Dual *x) {
      return Dual{value(x[0].v), slope(x[0].v) * x[0].d};
    };
  };
  auto integer = [](auto f) -> F {
    return [=](const Dual *x) { return constant(f(x[0].v, x[1].v)); };
  };
  return llvm::TypeSwitch<Operation *, F>(op)
      .Case([](arith::ConstantOp c) -> F {
        double v = 0;
        if (auto f = dyn_cast<FloatAttr>(c.getValue()))
          v = f.getValueAsDouble();
        else if (auto i = dyn_cast<IntegerAttr>(c.getValue()))
          v = c.getType().isInteger(1) ? double(i.getValue().getBoolValue())
                                       : double(i.getValue().getSExtValue());
        else
          return nullptr;
        return [=](const Dual *) { return constant(v); };
      })
      .Case([](arith::AddFOp) -> F {
        return [](const Dual *x) {
          return Dual{x[0].v + x[1].v, x[0].d + x[1].d};
        };
      })
      .Case([](arith::SubFOp) -> F {
        return [](const Dual *x) {
          return Dual{x[0].v - x[1].v, x[0].d - x[1].d};
        };
      })
      .Case([](arith::MulFOp) -> F {
        return [](const Dual *x) {
          return Dual{x[0].v * x[1].v, x[0].d * x[1].v + x[0].v * x[1].d};
        };
      })
      .Case([](arith::DivFOp) -> F {
        return [](const Dual *x) {
          return Dual{x[0].v / x[1].v,
                      (x[0].d * x[1].v - x[0].v * x[1].d) / (x[1].v * x[1].v)};
        };
      })
      .Case([](arith::NegFOp) -> F {
        return [](const Dual *x) { return Dual{-x[0].v, -x[0].d}; };
      })
      .Case<arith::MaximumFOp, arith::MaxNumFOp>([](auto) -> F {
        return [](const Dual *x) { return x[0].v >= x[1].v ? x[0] : x[1]; };
      })
      .Case<arith::MinimumFOp, arith::MinNumFOp>([](auto) -> F {
        return [](const Dual *x) { return x[0].v <= x[1].v ? x[0] : x[1]; };
      })
      .Case([](arith::SelectOp) -> F {
        return [](const Dual *x) { return x[0].v != 0 ? x[1] : x[2]; };
      })
      .Case([](arith::CmpFOp c) -> F {
        auto p = c.getPredicate();
        return [=](const Dual *x) {
          return constant(compareF(p, x[0].v, x[1].v));
        };
      })
      .Case([](arith::CmpIOp c) -> F {
        auto p = c.getPredicate();
        return [=](const Dual *x) {
          return constant(compareI(p, x[0].v, x[1].v));
        };
      })
      .Case<arith::AddIOp>([&](auto) {
        return integer([](double a, double b) { return a + b; });
      })
      .Case<arith::SubIOp>([&](auto) {
        return integer([](double a, double b) { return a - b; });
      })
      .Case<arith::MulIOp>([&](auto) {
        return integer([](double a, double b) { return a * b; });
      })
      .Case<arith::DivSIOp, arith::DivUIOp>([&](auto) {
        return integer([](double a, double b) { return std::trunc(a / b); });
      })
      .Case<arith::FloorDivSIOp>([&](auto) {
        return integer([](double a, double b) { return std::floor(a / b); });
      })
      .Case<arith::RemSIOp, arith::RemUIOp>([&](auto) {
        return integer([](double a, double b) { return std::fmod(a, b); });
      })
      .Case<arith::MaxSIOp, arith::MaxUIOp>([&](auto) {
        return integer([](double a, double b) { return std::max(a, b); });
      })
      .Case<arith::MinSIOp, arith::MinUIOp>([&](auto) {
        return integer([](double a, double b) { return std::min(a, b); });
      })
      .Case<arith::AndIOp>([&](auto) {
        return integer(
            [](double a, double b) { return double(int64_t(a) & int64_t(b)); });
      })
      .Case<arith::OrIOp>([&](auto) {
        return integer(
            [](double a, double b) { return double(int64_t(a) | int64_t(b)); });
      })
      .Case<arith::XOrIOp>([&](auto) {
        return integer(
            [](double a, double b) { return double(int64_t(a) ^ int64_t(b)); });
      })
      // Conversions keep the value (the reference does not round).
      .Case<arith::IndexCastOp, arith::IndexCastUIOp, arith::SIToFPOp,
            arith::UIToFPOp, arith::ExtSIOp, arith::ExtUIOp, arith::ExtFOp,
            arith::TruncFOp, arith::TruncIOp>(
          [](auto) -> F { return [](const Dual *x) { return x[0]; }; })
      .Case<arith::FPToSIOp, arith::FPToUIOp>([](auto) -> F {
        return [](const Dual *x) { return constant(std::trunc(x[0].v)); };
      })
      .Case([&](math::TanhOp) {
        return unary([](double a) { return std::tanh(a); },
                     [](double a) { return 1 - std::tanh(a) * std::tanh(a); });
      })
      .Case([&](math::ExpOp) {
        return unary([](double a) { return std::exp(a); },
                     [](double a) { return std::exp(a); });
      })
      .Case([&](math::Exp2Op) {
        return unary([](double a) { return std::exp2(a); },
                     [](double a) { return std::exp2(a) * kLn2; });
      })
      .Case([&](math::LogOp) {
        return unary([](double a) { return std::log(a); },
                     [](double a) { return 1 / a; });
      })
      .Case([&](math::Log2Op) {
        return unary([](double a) { return std::log2(a); },
                     [](double a) { return 1 / (a * kLn2); });
      })
      .Case([&](math::SqrtOp) {
        return unary([](double a) { return std::sqrt(a); },
                     [](double a) { return 0.5 / std::sqrt(a); });
      })
      .Case([&](math::RsqrtOp) {
        return unary([](double a) { return 1 / std::sqrt(a); },
                     [](double a) { return -0.5 / (a * std::sqrt(a)); });
      })
      .Case([&](math::AbsFOp) {
        return unary([](double a) { return std::fabs(a); },
                     [](double a) { return a < 0 ? -1.0 : 1.0; });
      })
      .Case([&](math::SinOp) {
        return unary([](double a) { return std::sin(a); },
                     [](double a) { return std::cos(a); });
      })
      .Case([&](math::CosOp) {
        return unary([](double a) { return std::cos(a); },
                     [](double a) { return -std::sin(a); });
      })
      .Case<math::FloorOp, math::CeilOp, math::RoundOp>([](auto r) -> F {
        const bool floor = isa<math::FloorOp>(r.getOperation()),
                   ceil = isa<math::CeilOp>(r.getOperation());
        return [=](const Dual *x) {
          return constant(floor  ? std::floor(x[0].v)
                          : ceil ? std::ceil(x[0].v)
                                 : std::round(x[0].v));
        };
      })
      .Case([](math::FmaOp) -> F {
        return [](const Dual *x) {
          return Dual{x[0].v * x[1].v + x[2].v,
                      x[0].d * x[1].v + x[0].v * x[1].d + x[2].d};
        };
      })
      .Default([](Operation *) -> F { return nullptr; });
}

/// A region's instructions, evaluated per score. A mask_mod region has no
/// score argument (its value is 1 where it keeps the score, 0 elsewhere);
/// its captured tensors start at \p firstCapture of the \p totalCaptures
/// that the evaluation is given.
class RegionScoreFunction : public ScoreFunction {
public:
  RegionScoreFunction(Region &region, int firstCapture, int totalCaptures)
      : firstCapture(firstCapture), totalCaptures(totalCaptures),
        what(attn::isMaskModRegion(region) ? "mask_mod" : "score_mod") {
    Block &body = region.front();
    llvm::DenseMap<Value, int> index;
    // A mask region's arguments start at slot 1, as a score region's batch
    // does: slot 0 is the (unused) score.
    args = attn::isMaskModRegion(region) ? 1 : 0;
    for (BlockArgument arg : body.getArguments())
      index[arg] = args++;
    for (Operation &op : body.without_terminator()) {
      Instr instr;
      if (auto load = dyn_cast<memref::LoadOp>(op)) {
        instr.capture =
            firstCapture + int(attn::capturedTensorOf(load.getMemRef()));
        instr.in.push_back(index.at(load.getIndices()[0]));
        index[op.getResult(0)] = args + int(code.size());
        code.push_back(std::move(instr));
        continue;
      }
      instr.eval = evaluatorOf(&op);
      if (!instr.eval || op.getNumResults() != 1)
        throw CompileError("the float64 reference cannot evaluate '" +
                           op.getName().getStringRef().str() + "' of the " +
                           what +
                           " region (it takes arith and "
                           "math ops of one result: add, sub, mul, div, neg, "
                           "min, max, select, compares, casts, tanh, exp, "
                           "exp2, log, log2, sqrt, rsqrt, absf, sin, cos, "
                           "floor, ceil, round, fma)");
      for (Value v : op.getOperands())
        instr.in.push_back(index.at(v));
      index[op.getResult(0)] = args + int(code.size());
      code.push_back(std::move(instr));
    }
    result = index.at(body.getTerminator()->getOperand(0));
  }

  double apply(double score, int64_t batch, int64_t head, int64_t qIdx,
               int64_t kvIdx, const Captures *captures,
               double *dScore) const override {
    std::vector<Dual> values =
        evaluate(score, batch, head, qIdx, kvIdx, captures, -1);
    *dScore = values[size_t(result)].d;
    return values[size_t(result)].v;
  }

  /// One evaluation per load of a captured tensor, seeded there.
  std::vector<CaptureRead> captureReads(double score, int64_t batch,
                                        int64_t head, int64_t qIdx,
                                        int64_t kvIdx,
                                        const Captures *captures) const override {
    std::vector<CaptureRead> out;
    for (size_t k = 0; k < code.size(); ++k) {
      if (code[k].capture < 0)
        continue;
      std::vector<Dual> values =
          evaluate(score, batch, head, qIdx, kvIdx, captures, int(k));
      out.push_back({code[k].capture,
                     int64_t(values[size_t(code[k].in[0])].v),
                     values[size_t(result)].d});
    }
    return out;
  }

private:
  /// Every value of the region at this score, the derivative by the score
  /// (\p seed < 0) or by the value instruction \p seed loads.
  std::vector<Dual> evaluate(double score, int64_t batch, int64_t head,
                             int64_t qIdx, int64_t kvIdx,
                             const Captures *captures, int seed) const {
    std::vector<Dual> values(size_t(args) + code.size());
    values[0] = {score, seed < 0 ? 1.0 : 0.0};
    const int64_t rest[] = {batch, head, qIdx, kvIdx};
    for (int i = 1; i <= 4; ++i)
      values[i] = constant(double(rest[i - 1]));
    if (totalCaptures > 0 &&
        (!captures || int(captures->size()) != totalCaptures))
      throw SpecError(fmt::format(
          "the modifier regions capture {} tensors, the data has {}",
          totalCaptures, captures ? captures->size() : 0));
    Dual in[3];
    for (size_t k = 0; k < code.size(); ++k) {
      const Instr &instr = code[k];
      if (instr.capture >= 0) {
        const std::vector<float> &t = (*captures)[size_t(instr.capture)];
        const double at = values[size_t(instr.in[0])].v;
        if (at < 0 || at >= double(t.size()))
          throw SpecError(fmt::format(
              "the {} region reads captured tensor {} at {}, outside "
              "its {} elements",
              what, instr.capture - firstCapture, at, t.size()));
        values[size_t(args) + k] = {double(t[size_t(at)]),
                                    int(k) == seed ? 1.0 : 0.0};
        continue;
      }
      for (size_t o = 0; o < instr.in.size() && o < 3; ++o)
        in[o] = values[size_t(instr.in[o])];
      values[size_t(args) + k] = instr.eval(in);
    }
    return values;
  }

  int firstCapture, totalCaptures;
  const char *what;
  int args = 0, result = 0;
  std::vector<Instr> code;
};

} // namespace

std::shared_ptr<const ScoreFunction>
scoreFunctionOf(Region &region, int64_t firstCapture, int64_t totalCaptures) {
  return std::make_shared<RegionScoreFunction>(region, int(firstCapture),
                                               int(totalCaptures));
}

} // namespace flashjit
