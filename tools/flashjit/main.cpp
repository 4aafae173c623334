//===- main.cpp - The flashjit binary -------------------------------------===//
//
/// \file
/// Everything lives in libflashjit.so; this binary only forwards argv.
//
//===----------------------------------------------------------------------===//

extern "C" int flashjit_cli_main(int argc, const char *const *argv);

int main(int argc, char **argv) { return flashjit_cli_main(argc, argv); }
