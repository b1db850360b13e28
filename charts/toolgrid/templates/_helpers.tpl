{{/*
The chart name (app.kubernetes.io/name).
*/}}
{{- define "toolgrid.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: the Deployment, Service, ServiceAccount and RBAC
objects. "<release>-toolgrid", or "<release>" when it already contains the chart name.
*/}}
{{- define "toolgrid.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
helm.sh/chart label value.
*/}}
{{- define "toolgrid.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "toolgrid.labels" -}}
helm.sh/chart: {{ include "toolgrid.chart" . }}
app.kubernetes.io/name: {{ include "toolgrid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolgrid
{{- end }}

{{/*
Selector labels of the controller pods (the Deployment's selector and the Service's).
Worker pods must never carry all three.
*/}}
{{- define "toolgrid.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolgrid.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/*
The controller's ServiceAccount.
*/}}
{{- define "toolgrid.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toolgrid.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The controller image: repository@digest, or repository:tag (tag defaults to appVersion).
*/}}
{{- define "toolgrid.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The address worker pods dial: the Service's gRPC port.
*/}}
{{- define "toolgrid.controlPlaneAddress" -}}
{{- $scheme := ternary "http" "https" (eq (include "toolgrid.tlsMode" .) "off") -}}
{{- printf "%s://%s.%s.svc:%v" $scheme (include "toolgrid.fullname" .) .Release.Namespace .Values.service.grpcPort }}
{{- end }}

{{/*
Where the controller's serving certificate comes from:
  off           tls.enabled=false: plaintext;
  secret        tls.secretName: an existing kubernetes.io/tls Secret;
  cert-manager  the cluster serves cert-manager.io/v1: the chart's Issuers and Certificate
                (certificate.yaml) write the Secret <fullname>-tls;
  self-signed   otherwise: the controller makes a CA and certificate, keeps them in the
                Secret <fullname>-self-signed-tls and rotates them (rbac.yaml lets it
                write that Secret only).
*/}}
{{- define "toolgrid.tlsMode" -}}
{{- if not .Values.tls.enabled }}off
{{- else if .Values.tls.secretName }}secret
{{- else if .Capabilities.APIVersions.Has "cert-manager.io/v1" }}cert-manager
{{- else }}self-signed
{{- end }}
{{- end }}

{{/*
The Secret the controller serves with (modes secret and cert-manager), and its CA key.
*/}}
{{- define "toolgrid.tlsSecret" -}}
{{- if eq (include "toolgrid.tlsMode" .) "secret" }}{{ .Values.tls.secretName }}
{{- else if eq (include "toolgrid.tlsMode" .) "cert-manager" }}{{ include "toolgrid.fullname" . }}-tls
{{- end }}
{{- end }}
{{- define "toolgrid.tlsCaKey" -}}
{{- if eq (include "toolgrid.tlsMode" .) "cert-manager" }}ca.crt{{ else }}{{ .Values.tls.caKey }}{{ end }}
{{- end }}

{{/*
The namespace of the default WorkerPool: the watched namespace, else the release's.
*/}}
{{- define "toolgrid.poolNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace }}
{{- end }}

{{/*
"true" when the default WorkerPool must be a post-install hook: this install creates the
CRDs, so the cluster does not serve its kind yet (see workerpool.yaml).
*/}}
{{- define "toolgrid.poolIsHook" -}}
{{- if and .Values.crds.install (not (.Capabilities.APIVersions.Has "toolgrid.dev/v1alpha1/WorkerPool")) }}true{{ end }}
{{- end }}

{{/*
Values that the schema cannot express (or that deserve a clearer message); included by
deployment.yaml so that an invalid combination fails the render.
*/}}
{{- define "toolgrid.validate" -}}
{{- if and (eq .Values.store.type "sqlite") (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount is %v but store.type is sqlite: the SQLite store has exactly one writer (a ReadWriteOnce volume). Use replicaCount: 1, or store.type: postgres with store.postgres.existingSecret for standby replicas." .Values.replicaCount) }}
{{- end }}
{{- if and (eq .Values.store.type "postgres") (not .Values.store.postgres.existingSecret) }}
{{- fail "store.type is postgres but store.postgres.existingSecret is empty: create a Secret with the PostgreSQL URL (postgres://...) and name it in store.postgres.existingSecret (key: store.postgres.secretKey)." }}
{{- end }}
{{- end }}
