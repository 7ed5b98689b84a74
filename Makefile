# Two commands a user needs: `make md` (the main job) and `make test` (the whole suite).
# NequIP 0.19 needs e3nn>=0.6 while mace-torch 0.3.16 pins e3nn==0.4.4, so the suite runs in two
# virtual environments built here. A CPU torch is installed first so that no CUDA torch is pulled in.
PYTHON ?= python3
VENVS  ?= .venvs
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1

EXTRAS_nequip := nequip,ase,test,cuda12
EXTRAS_mace   := mace,ase,test,cuda12
# e3nn 0.4.4 (pinned by MACE) reads its constants with torch.load, whose default became
# weights_only=True in torch 2.6; MACE's .model files are pickled modules too. Set only for MACE.
ENV_mace      := TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1

.PHONY: test test-nequip test-mace md envs clean-envs

test:
	@rc=0; $(MAKE) --no-print-directory test-nequip || rc=1; \
	$(MAKE) --no-print-directory test-mace || rc=1; \
	if [ $$rc -ne 0 ]; then echo "mlip_accel: test suite FAILED"; fi; exit $$rc

test-nequip test-mace: test-%: $(VENVS)/%/.stamp
	@echo "=== pytest in the $* environment ==="
	cd tests && $(ENV_$*) ../$(VENVS)/$*/bin/python -m pytest -p no:cacheprovider -m "not $(if $(filter nequip,$*),mace,nequip)" -rs $(PYTEST_ARGS) .

md: $(VENVS)/nequip/.stamp
	$(VENVS)/nequip/bin/mlip-accel md $(MD_ARGS)

envs: $(VENVS)/nequip/.stamp $(VENVS)/mace/.stamp

$(VENVS)/%/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENVS)/$*
	echo "$(TORCH_SPEC)" > $(VENVS)/$*/constraints.txt
	$(VENVS)/$*/bin/python -m pip install -q --upgrade pip
	$(VENVS)/$*/bin/python -m pip install -q "$(TORCH_SPEC)"
	PIP_CONSTRAINT=$(VENVS)/$*/constraints.txt $(VENVS)/$*/bin/python -m pip install -q -e ".[$(EXTRAS_$*)]"
	touch $@

clean-envs:
	rm -rf $(VENVS)
