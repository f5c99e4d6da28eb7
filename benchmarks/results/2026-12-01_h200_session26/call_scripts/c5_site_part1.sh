#!/bin/bash
# Session 26 call 5 (= c2, for c6) (issue #9): the tracked tree (~32 MiB on disk) + the engine site (37 MiB) are over
# the 64 MiB a call may carry, so the site travels in two calls on one warm machine: this one parks its first part in
# build/h200parts/ (an ignored path, kept on the machine between calls while it stays held), c6 brings the rest.
# run: bash this   (carry .carry/h200site.part.aa; split -b 19000000 .carry/h200site.tar.xz .carry/h200site.part.)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts && nvidia-smi -L
