# The tests' stand-in model server on real nodes: lightweight_server.py (health routes, request metrics,
# a start-up delay in place of a model load) on the operator image, which has its one dependency.
# Built by cluster/images.sh lightweight-server with this directory as the context.
ARG OPERATOR_IMAGE=preheat/operator:dev
FROM ${OPERATOR_IMAGE}
COPY lightweight_server.py /opt/lightweight/lightweight_server.py
ENTRYPOINT ["python", "/opt/lightweight/lightweight_server.py"]
