"""Prints the assembly of each #gpu.object<..., assembly = "..."> in an MLIR
file (argument, or stdin), unescaped: the PTX that
flashjit-gpu-module-to-ptx put in a gpu.binary. Exits 1 if there is none."""
import re
import sys

text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
# MLIR prints a string's '"', '\\' and non-printable bytes as \XX (hex).
objects = re.findall(r'assembly = "([^"]*)"', text)
for escaped in objects:
    sys.stdout.write(re.sub(r'\\([0-9A-Fa-f]{2})',
                            lambda m: chr(int(m.group(1), 16)), escaped))
sys.exit(0 if objects else 1)
