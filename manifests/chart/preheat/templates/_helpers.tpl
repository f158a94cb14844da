{{/* Names, labels and images shared by every template. */}}

{{- define "preheat.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: "preheat" for a release named preheat, else "<release>-preheat". */}}
{{- define "preheat.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "preheat.operatorName" -}}
{{- printf "%s-operator" (include "preheat.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "preheat.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: preheat
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "preheat.operatorSelectorLabels" -}}
app.kubernetes.io/name: preheat-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "preheat.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "preheat.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "preheat.peeringName" -}}
{{- default (include "preheat.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "preheat.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "preheat.serverImage" -}}
{{- printf "%s:%s" .Values.modelServer.image.repository (default .Chart.AppVersion .Values.modelServer.image.tag) -}}
{{- end -}}

{{- define "preheat.serverCudaImage" -}}
{{- printf "%s:%s" .Values.modelServer.cudaImage.repository (default .Chart.AppVersion .Values.modelServer.cudaImage.tag) -}}
{{- end -}}

{{/* All namespaces unless watchNamespaces lists some. */}}
{{- define "preheat.clusterWide" -}}
{{- if empty .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}
