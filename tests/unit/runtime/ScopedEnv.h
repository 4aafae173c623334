//===- ScopedEnv.h - An environment variable for one test -------*- C++ -*-===//
#ifndef FLASHJIT_TESTS_UNIT_RUNTIME_SCOPEDENV_H
#define FLASHJIT_TESTS_UNIT_RUNTIME_SCOPEDENV_H

#include <cstdlib>
#include <optional>
#include <string>

namespace flashjit::test {

/// Sets (or, with nullptr, unsets) an environment variable for the scope of
/// one test and restores it afterwards.
class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    if (const char *old = std::getenv(name))
      old_ = old;
    if (value)
      setenv(name, value, /*overwrite=*/1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;

private:
  const char *name_;
  std::optional<std::string> old_;
};

} // namespace flashjit::test

#endif // FLASHJIT_TESTS_UNIT_RUNTIME_SCOPEDENV_H
