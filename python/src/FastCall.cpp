//===- FastCall.cpp - flashjit_plan_forward without ctypes ---------------===//
//
/// \file
/// The Python extension module `flashjit._fastcall`: one function,
/// `plan_forward(plan, q, k, v, o, lse, counts, indices, stream)`, that
/// calls the C API's flashjit_plan_forward with nine pointers given as
/// Python ints (or None for NULL) and returns its status as an int.
///
/// Why: flashjit.attention's eager CUDA call makes this one foreign call
/// per attention, and ctypes spends about 1.5-2.5 us converting its nine
/// arguments and setting up the call (bench/NOTES.md, T37: the plan call
/// through ctypes 5.0-6.5 us against 3.7 us from C++ on the H100 host). A
/// METH_FASTCALL function converts them with PyLong_AsVoidPtr and calls
/// the function pointer directly.
///
/// The module does not link against libflashjit.so: `set_function(addr)`
/// takes flashjit_plan_forward's address from the library flashjit._lib
/// loaded (ctypes), so both always call the same library. Built against
/// the stable ABI of Python 3.10 (Py_LIMITED_API), one file serves every
/// CPython >= 3.10; flashjit._lib falls back to ctypes where it is absent
/// or FLASHJIT_FASTCALL=0.
//
//===----------------------------------------------------------------------===//

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace {

/// flashjit_plan_forward's signature (tools/capi/flashjit.h), all
/// arguments as untyped pointers.
using PlanForward = int (*)(const void *, const void *, const void *,
                            const void *, void *, void *, const void *,
                            const void *, void *);

constexpr Py_ssize_t kPlanForwardArgs = 9;

/// The function set_function gave (null until then).
PlanForward planForward = nullptr;

/// The pointer an argument stands for: None is null, an int its value
/// (PyLong_AsVoidPtr's conversion). False with a TypeError or
/// OverflowError set otherwise.
bool toPointer(PyObject *arg, Py_ssize_t index, void **out) {
  if (arg == Py_None) {
    *out = nullptr;
    return true;
  }
  if (!PyLong_Check(arg)) {
    PyErr_Format(PyExc_TypeError,
                 "flashjit._fastcall.plan_forward: argument %zd must be an "
                 "int (an address) or None",
                 index);
    return false;
  }
  *out = PyLong_AsVoidPtr(arg);
  return !(*out == nullptr && PyErr_Occurred());
}

/// set_function(address): the flashjit_plan_forward that plan_forward
/// calls (an int, not 0).
PyObject *setFunction(PyObject *, PyObject *arg) {
  void *address = nullptr;
  if (!toPointer(arg, 0, &address))
    return nullptr;
  if (!address) {
    PyErr_SetString(PyExc_ValueError,
                    "flashjit._fastcall.set_function: a null address");
    return nullptr;
  }
  planForward = reinterpret_cast<PlanForward>(address);
  Py_RETURN_NONE;
}

/// plan_forward(plan, q, k, v, o, lse, counts, indices, stream) -> status:
/// flashjit_plan_forward with the GIL released for the call.
PyObject *callPlanForward(PyObject *, PyObject *const *args, Py_ssize_t count) {
  if (count != kPlanForwardArgs) {
    PyErr_Format(PyExc_TypeError,
                 "flashjit._fastcall.plan_forward takes %zd arguments "
                 "(plan, q, k, v, o, lse, counts, indices, stream), got %zd",
                 kPlanForwardArgs, count);
    return nullptr;
  }
  if (!planForward) {
    PyErr_SetString(PyExc_RuntimeError,
                    "flashjit._fastcall.plan_forward: set_function was not "
                    "called");
    return nullptr;
  }
  void *p[kPlanForwardArgs];
  for (Py_ssize_t i = 0; i < kPlanForwardArgs; ++i)
    if (!toPointer(args[i], i, &p[i]))
      return nullptr;
  int status;
  Py_BEGIN_ALLOW_THREADS;
  status = planForward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8]);
  Py_END_ALLOW_THREADS;
  return PyLong_FromLong(status);
}

PyMethodDef methods[] = {
    {"set_function", setFunction, METH_O,
     "set_function(address): the flashjit_plan_forward to call."},
    {"plan_forward",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(callPlanForward)),
     METH_FASTCALL,
     "plan_forward(plan, q, k, v, o, lse, counts, indices, stream) -> "
     "status: flashjit_plan_forward with ints (addresses) or None."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef moduleDef = {PyModuleDef_HEAD_INIT,
                         "_fastcall",
                         "flashjit_plan_forward without ctypes "
                         "(python/src/FastCall.cpp).",
                         -1,
                         methods,
                         nullptr,
                         nullptr,
                         nullptr,
                         nullptr};

} // namespace

extern "C" __attribute__((visibility("default"))) PyObject *PyInit__fastcall() {
  return PyModule_Create(&moduleDef);
}
