# act_ros — developer commands. `make demo` and `make test` build the environment first.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The ROS 2 distribution whose rclpy and message wheels the environment gets from the
# Python package index: kilted (the `ros` extra, in .venv) or jazzy, the LTS (the
# `ros-jazzy` extra, in .venv-jazzy). A shell that sourced a ROS install sets it too.
ROS_DISTRO ?= kilted
ROS_DISTROS := kilted jazzy
ROS_EXTRA_kilted := ros
ROS_EXTRA_jazzy := ros-jazzy
VENV_kilted := .venv
VENV_jazzy := .venv-jazzy
VENV ?= $(or $(VENV_$(ROS_DISTRO)),.venv)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.act_ros-installed
EXTRAS ?= $(ROS_EXTRA_$(ROS_DISTRO)),sim,dataset,dev,openvino,onnxruntime,bench,bag,distributed,aloha
# gym-aloha declares mujoco<3.9 but runs on this package's MuJoCo (3.17, with dm-control
# 1.0.50 from the aloha extra): installed without its pins (docs/aloha.md).
GYM_ALOHA ?= gym-aloha==0.1.5

# Keep every ROS process that these targets start on loopback, in a domain of its own.
ROS_DOMAIN_ID ?= $(shell echo $$(( ($$$$ % 90) + 10 )))
export ROS_DOMAIN_ID
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export RMW_IMPLEMENTATION ?= rmw_fastrtps_cpp
export HF_HUB_OFFLINE ?= 1
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
# Full-size camera images between processes (see config/fastdds_large_images.xml), in the
# variable this distribution's Fast DDS reads: Kilted's 3.x the first (it warns that the
# second is deprecated), Jazzy's 2.14 only the second.
PROFILE_VARIABLE_kilted := FASTDDS_DEFAULT_PROFILES_FILE
PROFILE_VARIABLE_jazzy := FASTRTPS_DEFAULT_PROFILES_FILE
export $(PROFILE_VARIABLE_$(ROS_DISTRO)) ?= $(CURDIR)/config/fastdds_large_images.xml

.PHONY: help ros-distro setup test test-slow test-ros test-ros-fast test-all demo bench bench-check lint clean-venv

help:
	@echo "make demo   - set up if needed, then run the simulated task end to end over ROS 2"
	@echo "make test   - set up if needed, then run the test suite (without the slow checks)"
	@echo "make test-slow - the slow end-to-end checks (CI runs both); make test-all - everything"
	@echo "make test-ros - the tests that use ROS 2, fast and slow (ROS_DISTRO=jazzy: on Jazzy)"
	@echo "make test-ros-fast - the tests that use ROS 2 without the slow ones (CI on Jazzy)"
	@echo "make setup  - create/refresh the virtualenv ($(VENV)) with Python 3.12"
	@echo "ROS_DISTRO=jazzy - any of these with ROS 2 Jazzy's wheels in .venv-jazzy (default kilted, .venv)"
	@echo "make bench  - run the benchmarks and write a report"
	@echo "make bench-check - fast benchmarks against the committed baseline (fails on a regression)"
	@echo "make lint   - ruff over the package and tests"

setup: $(STAMP)

# Every target that builds or uses the environment checks the distribution first.
ros-distro:
	@if [ -z "$(filter $(ROS_DISTRO),$(ROS_DISTROS))" ]; then \
	  echo "error: ROS_DISTRO=$(ROS_DISTRO): the environment is built from the ROS 2 wheels on the Python package index, which exist for $(ROS_DISTROS) (make test ROS_DISTRO=jazzy)" >&2; \
	  exit 2; fi

# The venv is rebuilt when it is missing, when its Python is broken, or when the
# package's dependencies (setup.py) changed since it was installed.
$(STAMP): setup.py package.xml | ros-distro
	@set -e; \
	if [ -x "$(PY)" ] && ! "$(PY)" -c 'import sys' >/dev/null 2>&1; then \
	  echo "[setup] $(VENV) is broken: recreating"; rm -rf "$(VENV)"; fi; \
	if [ ! -x "$(PY)" ]; then \
	  base=$$(tools/find-python); \
	  echo "[setup] creating $(VENV) with $$base"; \
	  "$$base" -m venv "$(VENV)"; \
	fi; \
	"$(PY)" -m pip install --quiet --upgrade pip; \
	echo "[setup] installing act_ros[$(EXTRAS)] (first run downloads PyTorch, several GB)"; \
	"$(PY)" -m pip install --progress-bar off -e ".[$(EXTRAS)]"; \
	case ",$(EXTRAS)," in *,aloha,*) \
	  echo "[setup] installing $(GYM_ALOHA) without its pins (mujoco<3.9)"; \
	  "$(PY)" -m pip install --quiet --progress-bar off --no-deps "$(GYM_ALOHA)";; esac; \
	touch "$(STAMP)"; echo "[setup] ready: $(VENV)"

PYTEST_ARGS ?=
# Every extra is installed by make setup: a test needing one fails instead of skipping
# when it is missing (test/extras.py); 0 after make setup EXTRAS=... with fewer.
REQUIRE_EXTRAS ?= 1
# The suite without the end-to-end checks marked slow (multi-process training, over-ROS
# evaluations, exports under every backend); CI (.ci/run) runs those too: make test-slow.
test: $(STAMP)
	ACT_ROS_REQUIRE_EXTRAS=$(REQUIRE_EXTRAS) $(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	ACT_ROS_REQUIRE_EXTRAS=$(REQUIRE_EXTRAS) $(PY) -m pytest -m slow $(PYTEST_ARGS)

# The tests that use ROS 2 (marker ros, which test/conftest.py sets), fast and slow: what can
# differ between distributions.
test-ros: $(STAMP)
	ACT_ROS_REQUIRE_EXTRAS=$(REQUIRE_EXTRAS) $(PY) -m pytest -m ros $(PYTEST_ARGS)

# The fast tests that use ROS 2: what CI runs on Jazzy beside the whole suite on Kilted.
# Lock-step tests wait on best-effort camera messages, which a loaded machine can drop:
# CI reruns a failed one up to twice (PYTEST_ARGS="--reruns 2").
test-ros-fast: $(STAMP)
	ACT_ROS_REQUIRE_EXTRAS=$(REQUIRE_EXTRAS) $(PY) -m pytest -m "ros and not slow" $(PYTEST_ARGS)

# Everything in one pytest run.
test-all: $(STAMP)
	ACT_ROS_REQUIRE_EXTRAS=$(REQUIRE_EXTRAS) $(PY) -m pytest $(PYTEST_ARGS)

DEMO_ARGS ?=
demo: $(STAMP)
	$(PY) -m act_ros.demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m act_ros.bench all $(BENCH_ARGS)

# The fast benchmarks against the baseline committed for this CPU class; fails on a
# regression (docs/benchmarks/README.md). A slowed build: BENCH_CHECK_ARGS=--inject-slowdown=1.5
BENCH_CHECK_ARGS ?=
bench-check: $(STAMP)
	$(PY) -m act_ros.bench check $(BENCH_CHECK_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check act_ros test launch research docs/results setup.py

clean-venv:
	rm -rf "$(VENV)"
