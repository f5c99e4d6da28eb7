#!/bin/bash
# Session 30 call 4: a fresh machine (the first one was released): park the engine site's first part for c5.
# run: bash this   (carry .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts && nvidia-smi -L
