# Two commands a user needs: `make md` (the main job) and `make test` (the whole suite).
# NequIP 0.19 needs e3nn>=0.6 while mace-torch 0.3.16 pins e3nn==0.4.4, so the suite runs in two
# virtual environments built here. torch is installed first, pinned (TORCH_SPEC), so that the framework
# installs cannot pull in another torch; TORCH_PIP_ARGS picks its build, e.g. on a machine without a GPU
#   make md TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENVS  ?= .venvs
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# CUDA packages (CuPy + NVRTC, ~510 MB) only where an NVIDIA GPU is visible: `make md` on a CPU machine
# stays without them. `make test` always adds them: its compile test (tests/test_codegen_compile.py) runs
# NVRTC on the CPU for every generated kernel. CUDA_EXTRA=cuda13 for a torch built for CUDA 13.
CUDA_EXTRA ?= cuda12
HAVE_NVIDIA_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
GPU_EXTRA := $(if $(HAVE_NVIDIA_GPU),$(CUDA_EXTRA))

# e3nn 0.4.4 (pinned by MACE) reads its constants with torch.load, whose default became
# weights_only=True in torch 2.6; MACE's .model files are pickled modules too. Set only for MACE.
ENV_mace      := TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
ENVIRONMENTS  := nequip mace

comma := ,
space := $() $()
extras = $(subst $(space),$(comma),$(strip $(1)))

.PHONY: test test-nequip test-mace md envs clean-envs
# built through a pattern chain (.stamp-test needs .stamp): make would delete .stamp as an intermediate file
.PRECIOUS: $(VENVS)/%/.stamp $(VENVS)/%/.stamp-test

# Runs both environments even when the first fails, then prints one verdict line per environment and an
# overall 'N passed, N failed, N skipped' line (tests/verdict.py); non-zero exit on any failure.
test:
	@rm -f $(foreach env,$(ENVIRONMENTS),$(VENVS)/$(env)/test-counts.json); \
	for env in $(ENVIRONMENTS); do $(MAKE) --no-print-directory test-$$env; done; \
	echo "=== verdict ==="; \
	$(PYTHON) tests/verdict.py $(foreach env,$(ENVIRONMENTS),$(env)=$(VENVS)/$(env)/test-counts.json)

test-nequip test-mace: test-%: $(VENVS)/%/.stamp-test
	@echo "=== pytest in the $* environment ==="
	@rm -f $(VENVS)/$*/test-counts.json
	cd tests && MLIP_ACCEL_TEST_COUNTS=$(abspath $(VENVS))/$*/test-counts.json $(ENV_$*) \
		$(abspath $(VENVS))/$*/bin/python -m pytest \
		-p no:cacheprovider -m "not $(if $(filter nequip,$*),mace,nequip)" -rs $(PYTEST_ARGS) .

md: $(VENVS)/nequip/.stamp
	$(VENVS)/nequip/bin/mlip-accel md $(MD_ARGS)

envs: $(foreach env,$(ENVIRONMENTS),$(VENVS)/$(env)/.stamp-test)

# The environment `make md` needs: torch, then mlip_accel (editable) with its framework (and CUDA on a GPU).
$(VENVS)/%/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENVS)/$*
	echo "$(TORCH_SPEC)" > $(VENVS)/$*/constraints.txt
	$(VENVS)/$*/bin/python -m pip install -q --upgrade pip
	$(VENVS)/$*/bin/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	PIP_CONSTRAINT=$(VENVS)/$*/constraints.txt $(VENVS)/$*/bin/python -m pip install -q \
		-e ".[$(call extras,$* $(GPU_EXTRA))]"
	touch $@

# What the test suite adds on top: pytest and the CUDA extra (NVRTC compiles without a GPU).
$(VENVS)/%/.stamp-test: $(VENVS)/%/.stamp
	PIP_CONSTRAINT=$(VENVS)/$*/constraints.txt $(VENVS)/$*/bin/python -m pip install -q \
		-e ".[$(call extras,$* test $(CUDA_EXTRA))]"
	touch $@

clean-envs:
	rm -rf $(VENVS)

# --- TorchSim (issue 16) -------------------------------------------------------------------------------
# torch-sim-atomistic 0.6 is Python>=3.12 code (PEP 695 generics: a SyntaxError on 3.11, so no
# --ignore-requires-python), and the CPU torch wheel at hand is for 3.11 only. Its tests get two 3.12
# environments of their own, one per framework as above, with PyPI's torch 2.13: a CUDA build that runs on
# the CPU (~5 GB and ~3-4 min each). They run tests/test_torchsim*.py only; the 3.11 environments skip them.
ENVIRONMENTS += ts-nequip ts-mace
PYTHON312 ?= $(firstword $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3.12; do \
               $$p -c '' 2>/dev/null && echo $$p; done))

test-ts-nequip test-ts-mace: test-ts-%: $(VENVS)/ts-%/.stamp-test
	@echo "=== pytest (TorchSim tests) in the ts-$* environment ==="
	@rm -f $(VENVS)/ts-$*/test-counts.json
	cd tests && MLIP_ACCEL_TEST_COUNTS=$(abspath $(VENVS))/ts-$*/test-counts.json $(ENV_$*) \
		$(abspath $(VENVS))/ts-$*/bin/python -m pytest \
		-p no:cacheprovider -m "not $(if $(filter nequip,$*),mace,nequip)" -rs $(PYTEST_ARGS) test_torchsim*.py

$(VENVS)/ts-%/.stamp-test: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "TorchSim tests: no Python 3.12 found (set PYTHON312=...)"; exit 1; }
	$(PYTHON312) -m venv $(VENVS)/ts-$*
	echo "$(TORCH_SPEC)" > $(VENVS)/ts-$*/constraints.txt
	$(VENVS)/ts-$*/bin/python -m pip install -q --upgrade pip
	PIP_CONSTRAINT=$(VENVS)/ts-$*/constraints.txt $(VENVS)/ts-$*/bin/python -m pip install -q \
		-e ".[$*,test,torchsim]"
	touch $@
